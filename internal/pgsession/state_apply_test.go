package pgsession

import (
	"database/sql/driver"
	"slices"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// apply runs ApplyLocked for one statement text, its keys the literals
// 1, 2, … in call order, with the answers given.
func apply(t *testing.T, s *State[advisorykey.Key], text string, results []driver.Value, inTx bool) (pending map[advisorykey.Key]int, freed int) {
	t.Helper()
	adv := sqlscan.ParseAdvisory(text)
	keys := make([]advisorykey.Key, len(adv.Calls))
	for i, call := range adv.Calls {
		keys[i] = advisorykey.Key{K1: call.Args[0].Value, Shared: call.Func&sqlscan.FnShared != 0}
	}
	s.Lock()
	defer s.Unlock()
	gen := s.Gen
	pending = s.ApplyLocked(adv.Calls, keys, results, inTx, "app.go:9", noSpan, func(time.Time) { freed++ })
	if s.Gen == gen {
		t.Errorf("%s: Gen unchanged", text)
	}
	return pending, freed
}

// A statement's calls take effect left to right: locks stack, a try-lock
// counts by its answer, an unknown answer is pending unless the key is
// already held, transaction-level locks count only inside a transaction
// block, and each release that frees a key is told.
func TestApplyLocked(t *testing.T) {
	var s State[advisorykey.Key]
	k := func(n int64) advisorykey.Key { return advisorykey.Key{K1: n} }
	apply(t, &s, "SELECT pg_advisory_lock(1), pg_advisory_lock(1)", nil, false)
	if l := s.Held[k(1)]; l == nil || l.Count != 2 || l.Site != "app.go:9" {
		t.Fatalf("after two locks of 1: %+v", l)
	}
	apply(t, &s, "SELECT pg_try_advisory_lock(2), pg_try_advisory_lock(3)", []driver.Value{true, false}, false)
	if s.Held[k(2)] == nil || s.Held[k(3)] != nil {
		t.Errorf("try-locks answered true, false: held 2 %v, 3 %v", s.Held[k(2)] != nil, s.Held[k(3)] != nil)
	}
	pending, _ := apply(t, &s, "SELECT pg_try_advisory_lock(1), pg_try_advisory_lock(4), pg_try_advisory_xact_lock(5)", nil, true)
	if l := s.Held[k(1)]; len(pending) != 2 || pending[k(4)] != 1 || pending[k(5)] != -1 || l == nil || l.Count != 3 {
		t.Fatalf("try-locks without answers: pending %v (want 4: +1, 5: -1), 1 held %+v (want 3 times: held, so certain)", pending, l)
	}
	// Left to right: the lock of 7 makes the try-lock after it certain.
	if pending, _ := apply(t, &s, "SELECT pg_advisory_lock(7), pg_try_advisory_lock(7)", nil, false); pending != nil || s.Held[k(7)] == nil || s.Held[k(7)].Count != 2 {
		t.Errorf("a lock then a try-lock of one key: pending %v, 7 held %+v; want nothing pending, held twice", pending, s.Held[k(7)])
	}
	apply(t, &s, "SELECT pg_advisory_xact_lock(6)", nil, false)
	if s.Xact[k(6)] != 0 {
		t.Error("a transaction-level lock outside a transaction block was kept")
	}
	apply(t, &s, "SELECT pg_advisory_xact_lock(6)", nil, true)
	if s.Xact[k(6)] != 1 || s.XactSite != "app.go:9" {
		t.Errorf("a transaction-level lock inside one: %d at %q", s.Xact[k(6)], s.XactSite)
	}
	if _, freed := apply(t, &s, "SELECT pg_advisory_unlock(1), pg_advisory_unlock(2)", nil, false); freed != 1 || s.Held[k(1)] == nil || s.Held[k(1)].Count != 2 || s.Held[k(2)] != nil {
		t.Errorf("unlocks of 1 (held 3 times) and 2: %d freed, want 1 (2)", freed)
	}
	if _, freed := apply(t, &s, "SELECT pg_advisory_unlock_all()", nil, false); freed != 2 || len(s.Held) != 0 {
		t.Errorf("unlock_all: %d freed, %d still held; want 2 freed (1 and 7), none held", freed, len(s.Held))
	}
}

// The unlocks of a statement of several calls that find their key not
// held at that point: held locks count as taken, calls count left to
// right, an unlock-all clears, transaction-level calls and try-locks
// (whose answer is not known before) count for nothing.
func TestUnheldUnlocks(t *testing.T) {
	var s State[advisorykey.Key]
	apply(t, &s, "SELECT pg_advisory_lock(1)", nil, false)
	for _, c := range []struct {
		text string
		want []int64
	}{
		{"SELECT pg_advisory_unlock(1), pg_advisory_unlock(1)", []int64{1}},
		{"SELECT pg_advisory_unlock(2), pg_advisory_lock(2), pg_advisory_unlock(2)", []int64{2, 2}}, // as before the move: the count goes below 0 where Postgres's stays at 0, so the second unlock is named too
		{"SELECT pg_advisory_lock(3), pg_advisory_unlock(3), pg_advisory_unlock(1)", nil},
		{"SELECT pg_advisory_unlock_all(), pg_advisory_unlock(1)", []int64{1}},
		{"SELECT pg_try_advisory_lock(4), pg_advisory_xact_lock(4), pg_advisory_unlock(4)", []int64{4}},
	} {
		adv := sqlscan.ParseAdvisory(c.text)
		keys := make([]advisorykey.Key, len(adv.Calls))
		for i, call := range adv.Calls {
			if len(call.Args) > 0 {
				keys[i] = advisorykey.Key{K1: call.Args[0].Value}
			}
		}
		s.Lock()
		got := s.UnheldUnlocksLocked(adv.Calls, keys)
		s.Unlock()
		var ids []int64
		for _, k := range got {
			ids = append(ids, k.K1)
		}
		if !slices.Equal(ids, c.want) {
			t.Errorf("%s: unheld %v, want %v", c.text, ids, c.want)
		}
	}
}

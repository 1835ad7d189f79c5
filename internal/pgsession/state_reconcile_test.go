package pgsession

import (
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// What pg_locks shows is the truth: locks gone are forgotten (their hold
// time recorded), unknown ones learnt, counts the server cannot show
// never lowered.
func TestReconcileFollowsTheServer(t *testing.T) {
	k := func(n int64) advisorykey.Key { return advisorykey.Key{K1: n} }
	var s State[advisorykey.Key]
	s.AddLocked(k(1), "a.go:1", noSpan, 3) // held, still shown: kept, count 3
	s.AddLocked(k(2), "a.go:2", noSpan, 1) // held, gone: forgotten
	s.AddXactLocked(k(9), "a.go:9")        // the transaction's, gone (ROLLBACK TO SAVEPOINT)
	s.Unverified = true
	var freed int
	now := time.Now()
	gen := s.Gen
	s.ReconcileLocked([]advisorykey.Key{k(1), k(3), k(4), k(5)}, map[advisorykey.Key]int{k(4): 2, k(5): -1}, false, false, "b.go:7", now,
		func(time.Time) { freed++ })

	if freed != 1 || s.Held[k(2)] != nil {
		t.Errorf("a lock the server no longer shows: freed %d times, still held %v", freed, s.Held[k(2)] != nil)
	}
	if l := s.Held[k(1)]; l == nil || l.Count != 3 || l.Approx {
		t.Errorf("a known lock the server shows: %+v, want count 3, exact", l)
	}
	if l := s.Held[k(3)]; l == nil || l.Count != 1 || !l.Approx || l.Site != "b.go:7" || !l.Since.Equal(now) {
		t.Errorf("an unknown lock: %+v, want learnt once, approximate, at b.go:7", l)
	}
	if l := s.Held[k(4)]; l == nil || l.Count != 2 || l.Approx {
		t.Errorf("a pending try-lock taken twice: %+v", l)
	}
	if s.Xact[k(5)] != 1 || s.Held[k(5)] != nil || s.Xact[k(9)] != 0 {
		t.Errorf("transaction-level locks: %v, want only key 5, once", s.Xact)
	}
	if s.Unverified || s.Gen == gen || s.Recheck {
		t.Errorf("after a read outside a transaction: unverified %v, gen changed %v, recheck %v", s.Unverified, s.Gen != gen, s.Recheck)
	}
}

// Inside a transaction its own transaction-level locks are not taken for
// session locks, an uncertain statement marks counts approximate, and the
// backend is read again once the transaction ends.
func TestReconcileInATransaction(t *testing.T) {
	k := advisorykey.Key{K1: 7}
	var s State[advisorykey.Key]
	s.AddLocked(advisorykey.Key{K1: 1}, "a.go:1", noSpan, 1)
	s.AddXactLocked(k, "a.go:2")
	s.ReconcileLocked([]advisorykey.Key{{K1: 1}, k}, nil, true, true, "b.go:1", time.Now(), func(time.Time) {})
	if s.Held[k] != nil || s.Xact[k] != 1 {
		t.Errorf("the transaction's own lock became a session lock: held %v, xact %d", s.Held[k] != nil, s.Xact[k])
	}
	if !s.Held[advisorykey.Key{K1: 1}].Approx || !s.Recheck {
		t.Errorf("an uncertain statement in a transaction: approx %v, recheck %v", s.Held[advisorykey.Key{K1: 1}].Approx, s.Recheck)
	}

	var f State[advisorykey.Key]
	f.TextTx = true
	f.ReadFailedLocked(true, false)
	if f.TextTx {
		t.Error("25P01: the block believed open is still open")
	}
	f.ReadFailedLocked(false, true)
	if !f.Recheck {
		t.Error("a read failed inside a transaction is not made again after it")
	}
}

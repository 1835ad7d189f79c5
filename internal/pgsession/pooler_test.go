package pgsession

import (
	"errors"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// advisoryOf scans text's advisory calls and their literal keys.
func advisoryOf(text string) (*sqlscan.Advisory, []namedKey, []bool) {
	adv := sqlscan.ParseAdvisory(text)
	keys, known := make([]namedKey, len(adv.Calls)), make([]bool, len(adv.Calls))
	for i, call := range adv.Calls {
		if call.NArgs == 1 && call.Args[0].Kind == sqlscan.ArgLiteral {
			keys[i], known[i] = namedKey{K1: call.Args[0].Value, Shared: call.Func&sqlscan.FnShared != 0}, true
		}
	}
	return &adv, keys, known
}

// Through a declared transaction pooler a lone session call runs on the
// holder, transaction-level calls in the application's transaction, and
// what cannot be split is refused; without one nothing runs on a holder.
func TestOnHolder(t *testing.T) {
	c := new(Conn[namedKey])
	c.Init(&Settings{TxPooler: true}, nil)
	for _, tc := range []struct {
		text    string
		on, err bool
	}{
		{"SELECT pg_advisory_lock(1)", true, false},
		{"SELECT pg_try_advisory_lock(1), pg_advisory_unlock(2)", true, false},
		{"SELECT pg_advisory_xact_lock(1)", false, false},
		{"SELECT pg_advisory_lock(1), pg_advisory_xact_lock(2)", false, true},
		{"SELECT pg_advisory_lock(1), pg_advisory_lock(2)", false, true},
		{"SELECT pg_advisory_lock(id) FROM jobs", false, true},
	} {
		adv, _, _ := advisoryOf(tc.text)
		on, err := c.OnHolder(adv)
		if on != tc.on || (err != nil) != tc.err {
			t.Errorf("%s: on the holder %v, error %v; want %v, error %v", tc.text, on, err, tc.on, tc.err)
		}
	}
	direct := new(Conn[namedKey])
	direct.Init(&Settings{}, nil)
	if adv, _, _ := advisoryOf("SELECT pg_advisory_lock(1)"); func() bool { on, _ := direct.OnHolder(adv); return on }() {
		t.Error("a direct connection runs a lock on a holder")
	}
}

// A session lock on a key held at transaction level (either mode) is
// refused through a transaction pooler, and the reverse; unlocks and
// other keys are not.
func TestSplitConflict(t *testing.T) {
	h := &testHost{}
	c := new(Conn[namedKey])
	c.Init(&Settings{TxPooler: true}, h)
	c.Lock()
	c.Xact = map[namedKey]int{{K1: 1, Shared: true}: 1}
	c.AddLocked(namedKey{K1: 2}, "s.go:1", noSpan, 1)
	c.Unlock()
	for text, refused := range map[string]bool{
		"SELECT pg_advisory_lock(1)":      true,
		"SELECT pg_advisory_xact_lock(2)": true,
		"SELECT pg_advisory_unlock(1)":    false,
		"SELECT pg_advisory_lock(3)":      false,
		"SELECT pg_advisory_xact_lock(1)": false,
	} {
		adv, keys, known := advisoryOf(text)
		if err := c.SplitConflict(adv, keys, known); (err != nil) != refused {
			t.Errorf("%s: %v, want refused %v", text, err, refused)
		}
	}
}

// Once a pooler nobody declared is seen, a connection holding session
// locks loses them (with ErrTransactionPooler) and is settled; one that
// holds none is refused a session lock only.
func TestRefuseThroughPooler(t *testing.T) {
	h := &testHost{ends: NewEndQueue()}
	h.c = new(Conn[namedKey])
	c := h.c
	c.Init(&Settings{}, h)
	seen := PoolerError(h, "runs on backend pid 2")
	lock, _, _ := advisoryOf("SELECT pg_advisory_lock(1)")
	xact, _, _ := advisoryOf("SELECT pg_advisory_xact_lock(1)")
	if err := c.RefuseThroughPooler(lock, nil); err != nil {
		t.Fatalf("no pooler seen: %v", err)
	}
	if err := c.RefuseThroughPooler(lock, seen); err != seen {
		t.Fatalf("a session lock after the proof: %v, want the proof", err)
	}
	if err := c.RefuseThroughPooler(xact, seen); err != nil {
		t.Fatalf("a transaction-level lock after the proof: %v", err)
	}
	c.Lock()
	c.AddLocked(namedKey{K1: 5}, "p.go:1", noSpan, 1)
	c.Unlock()
	err := c.RefuseThroughPooler(nil, seen)
	if !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrTransactionPooler) || !strings.Contains(err.Error(), "may no longer be held") {
		t.Fatalf("a holder after the proof: %v, want its locks lost through the pooler", err)
	}
	if h.settled.Load() != 1 || len(h.reports) != 1 || !c.HoldsNothing() {
		t.Fatalf("settled %d, reported %d, holds nothing %v; want 1, 1, true", h.settled.Load(), len(h.reports), c.HoldsNothing())
	}
}

package pgsession

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// guardOf returns a guard over p whose pool has inUse of limit
// connections in use (known: the *sql.DB is known), with the given turns,
// counting the deadlocks it records.
func guardOf(p *Registry[namedKey, *member], inUse, limit int, known bool, turns []Turn[*member], recorded *int) *PoolGuard[namedKey, *member] {
	return &PoolGuard[namedKey, *member]{Registry: p, Pool: "orders",
		Counts:     func() (int, int, bool) { return inUse, limit, known },
		Turns:      func() []Turn[*member] { return turns },
		Deadlocked: func(string) { *recorded++ },
		Describe:   func(k int64) string { return "key " + strconv.FormatInt(k, 10) }}
}

// awaitOnServer has m own key's turn for a lock statement in flight.
func (m *member) awaitOnServer(key int64) {
	m.st.Lock()
	m.st.HasPendingTurn, m.st.PendingTurn, m.st.Busy = true, key, 1
	m.st.Unlock()
}

// A deadlock is proven only when every connection in use waits for a key
// whose holder needs the pool, followed to a fixed point: A waits on the
// server for key 5, held by the parked P; B waits in memory behind A; D
// behind B's own turn of key 7 (listed first, so one pass is not enough);
// E behind an AdvisoryLock that waits for a connection. Four connections
// in use of four: a deadlock, naming the parked holder; one more in use,
// a full pool not proven, an unknown pool or one that may grow: none.
func TestPoolGuardProvesADeadlockToAFixedPoint(t *testing.T) {
	p := newTestRegistry(nil)
	parked := &member{id: 9}
	parked.hold(5, true)
	p.Settle(parked)
	a, b, d, e := &member{id: 1}, &member{id: 2}, &member{id: 4}, &member{id: 5}
	a.awaitOnServer(5)
	turns := []Turn[*member]{
		{Key: 7, Owner: b, Waiters: []*member{d}},
		{Key: 5, Owner: a, Waiters: []*member{b}},
		{Key: 8, NeedsPool: true, Waiters: []*member{e}},
	}
	recorded := 0
	err := guardOf(p, 4, 4, true, turns, &recorded).Deadlock(5)
	if !errors.Is(err, ErrPoolDeadlock) || !strings.Contains(err.Error(), "held by connection #9, parked") || !strings.Contains(err.Error(), `all 4 connections of database "orders" (SetMaxOpenConns(4))`) || recorded != 1 {
		t.Fatalf("four stuck of four: %v (%d recorded)", err, recorded)
	}
	for _, c := range []struct {
		name         string
		inUse, limit int
		known        bool
	}{{"one more in use", 5, 5, true}, {"room to grow", 4, 5, true}, {"no limit", 4, 0, true}, {"an unknown pool", 4, 4, false}} {
		if err := guardOf(p, c.inUse, c.limit, c.known, turns, &recorded).Deadlock(5); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if recorded != 1 {
		t.Errorf("%d deadlocks recorded, want 1", recorded)
	}

	// Once P is lost or in use again, its key's waits may end: no deadlock.
	parked.st.Lock()
	parked.st.Parked = false
	parked.st.Unlock()
	if err := guardOf(p, 3, 3, true, turns, &recorded).Deadlock(5); err != nil {
		t.Errorf("holder in use: %v", err)
	}
}

// Watch ends the wait with the deadlock once it is proven, with
// ErrClosedWhileQueued at db.Close, and not at all when the wait stops.
func TestPoolGuardWatch(t *testing.T) {
	watch := func(g *PoolGuard[namedKey, *member], stop chan struct{}) error {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		done := make(chan struct{})
		go func() { defer close(done); g.Watch(ctx, stop, 5, cancel) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Watch did not return")
		}
		return context.Cause(ctx)
	}
	recorded := 0
	p := newTestRegistry(nil)
	parked, a := &member{id: 9}, &member{id: 1}
	parked.hold(5, true)
	p.Settle(parked)
	a.awaitOnServer(5)
	stuck := []Turn[*member]{{Key: 5, Owner: a}}
	if err := watch(guardOf(p, 1, 1, true, stuck, &recorded), nil); !errors.Is(err, ErrPoolDeadlock) {
		t.Errorf("a deadlocked pool: %v", err)
	}
	stop := make(chan struct{})
	close(stop)
	if err := watch(guardOf(p, 1, 1, false, stuck, &recorded), stop); err != nil {
		t.Errorf("a stopped wait: %v", err)
	}
	p.Close()
	if err := watch(guardOf(p, 1, 1, false, stuck, &recorded), nil); !errors.Is(err, ErrClosedWhileQueued) || !strings.Contains(err.Error(), "(advisory lock key 5)") {
		t.Errorf("db.Close: %v", err)
	}
}

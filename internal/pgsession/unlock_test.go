package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// takeTracked takes k on c's backend and tracks it as a session lock
// taken at site.
func takeTracked(t *testing.T, ctx context.Context, c *Conn[namedKey], h *testHost, k namedKey, site string) {
	t.Helper()
	q := "SELECT pg_advisory_lock($1)"
	if k.Shared {
		q = "SELECT pg_advisory_lock_shared($1)"
	}
	if _, err := h.QueryValue(ctx, q, driver.NamedValue{Ordinal: 1, Value: k.K1}); err != nil {
		t.Fatal(err)
	}
	c.Lock()
	c.AddLocked(k, site, noSpan, 1)
	c.UpdateLocked()
	c.Unlock()
}

// heldOnServer reports whether c's backend holds k, as pg_locks shows it.
func heldOnServer(t *testing.T, ctx context.Context, h *testHost, k namedKey) bool {
	t.Helper()
	held, _, _, err := ReadLocksOn[namedKey](ctx, h.inner, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range held {
		if x == k {
			return true
		}
	}
	return false
}

// An unlock rerouted to the parked holder releases the key there, and the
// tracking forgets it; an unlock of a key it does not hold, or one the
// server answers false, is refused with ErrNotLockOwner, and the latter
// makes the tracking read the server again.
func TestUnlockParked(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	k, gone := namedKey{K1: 61}, namedKey{K1: 62}
	takeTracked(t, ctx, c, h, k, "park.go:1")
	c.Lock()
	c.Parked = true
	c.Unlock()
	if parked, site, since := c.ParkedHold(k); !parked || site != "park.go:1" || since.IsZero() {
		t.Fatalf("ParkedHold: parked %v, site %q, since %v", parked, site, since)
	}
	if err := c.UnlockParked(ctx, k, "park.go:1"); err != nil {
		t.Fatal(err)
	}
	if heldOnServer(t, ctx, h, k) || h.rerouted.Load() != 1 || h.holdEnds.Load() != 1 {
		t.Fatalf("after the rerouted unlock: held on the server %v, rerouted %d, holds ended %d; want false, 1, 1",
			heldOnServer(t, ctx, h, k), h.rerouted.Load(), h.holdEnds.Load())
	}
	if parked, site, _ := c.ParkedHold(k); !parked || site != "" {
		t.Fatalf("the tracking still holds the key (site %q)", site)
	}
	if err := c.UnlockParked(ctx, k, ""); !errors.Is(err, ErrNotLockOwner) {
		t.Fatalf("an unlock of a key no longer held: %v, want ErrNotLockOwner", err)
	}
	// Tracked, but not held on the server: Postgres answers false.
	c.Lock()
	c.AddLocked(gone, "park.go:2", noSpan, 1)
	c.Unlock()
	if err := c.UnlockParked(ctx, gone, "park.go:2"); !errors.Is(err, ErrNotLockOwner) || !strings.Contains(err.Error(), "returned false") {
		t.Fatalf("an unlock the server refused: %v, want ErrNotLockOwner, returned false", err)
	}
	if _, site, _ := c.ParkedHold(gone); site != "" {
		t.Fatal("after the server's false the tracking still holds the key")
	}
}

// An unlock rerouted to a holder that keeps another lock carries the
// annotation that names the lock it keeps (its arguments renumbered after
// the uncached statements' own), so that its last statement still names
// it to other processes.
func TestUnlockParkedNamesTheLockThatStays(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	pid, err := h.BackendPID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k, stays := namedKey{K1: 63}, namedKey{K1: 64}
	takeTracked(t, ctx, c, h, stays, "park.go:3")
	takeTracked(t, ctx, c, h, k, "park.go:4")
	c.Lock()
	c.Parked = true
	c.Unlock()
	if err := c.UnlockParked(ctx, k, "park.go:4"); err != nil {
		t.Fatal(err)
	}
	var last string // the backend's last statement, the unlock, seen from outside
	if err := h.raw.QueryRowContext(ctx, "SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&last); err != nil {
		t.Fatal(err)
	}
	id := identity.ParseAnnotation(last)
	if id == nil || id.Site != "park.go:3" || !strings.Contains(last, "pg_advisory_unlock") {
		t.Fatalf("the backend's last statement %q names %+v; want the unlock, annotated with the lock taken at park.go:3", last, id)
	}
	if heldOnServer(t, ctx, h, k) || !heldOnServer(t, ctx, h, stays) {
		t.Fatalf("after the rerouted unlock: key 63 held %v, key 64 held %v; want false, true", heldOnServer(t, ctx, h, k), heldOnServer(t, ctx, h, stays))
	}
}

// A loss empties the tracking, fails statements from then on with an
// error that names the keys and where the oldest was taken, reports once,
// frees what waits in the process before Lost's channel closes, and
// wraps ErrTransactionPooler when a pooler made it; the connection's own
// backend is not ended where it was not proven to reach the server.
func TestMarkLostOn(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	if err := c.MarkLostOn(1, "died", errors.New("x"), LossReport); err != nil {
		t.Fatalf("a connection that holds nothing lost %v", err)
	}
	takeTracked(t, ctx, c, h, namedKey{K1: 71}, "lose.go:7")
	pid, err := h.BackendPID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("reset by peer")
	lost := c.MarkLostOn(pid, "its connection died (reset by peer)", cause, LossReport|LossEnd|LossPooler)
	if !errors.Is(lost, ErrLockLost) || !errors.Is(lost, ErrTransactionPooler) || !strings.Contains(lost.Error(), "key 71") || !strings.Contains(lost.Error(), "lose.go:7") {
		t.Fatalf("loss %v: want ErrLockLost and ErrTransactionPooler, naming key 71 taken at lose.go:7", lost)
	}
	select {
	case <-c.LostChan():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost's channel did not close")
	}
	if len(h.reports) != 1 || h.lockLost.Load() != 1 {
		t.Fatalf("%d reports, %d LockLost calls; want one each", len(h.reports), h.lockLost.Load())
	}
	r := h.reports[0]
	if r.PID != pid || r.N != 1 || r.Cause != cause || r.Err != lost || !strings.Contains(r.Backend, "left to the server") {
		t.Fatalf("report %+v", r)
	}
	if !h.ends.Empty() {
		t.Fatal("the backend of a connection not proven to reach the server was queued to be ended")
	}
	if h.lockLost.Load() != 1 {
		t.Fatal("what waits on the lock in this process was not freed")
	}
	if again := c.MarkLostOn(pid, "again", cause, LossReport); again != lost || len(h.reports) != 1 {
		t.Fatalf("a second loss returned %v and reported %d times; want the first, once", again, len(h.reports))
	}
	if c.Active.Load() != true {
		t.Fatal("a lost connection is not on the slow path (its statements must fail)")
	}
	rawconn.Exec(context.Background(), h.inner, "SELECT pg_advisory_unlock_all()")
}

// Where the package's rule allows it (the connection reached the server
// itself, no pooler, the backend's incarnation known), a loss with
// LossEnd queues its backend to be ended, and the report says so; without
// LossEnd, or through a pooler, it does not.
func TestMarkLostOnEndsOnlyWhereAllowed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    Settings
		flags  LossFlags
		queued bool
	}{
		{"direct", Settings{}, LossReport | LossEnd, true},
		{"no LossEnd", Settings{}, LossReport, false},
		{"pinning pooler", Settings{PinningPooler: true}, LossReport | LossEnd, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, c, h := reconcileEnv(t, tc.set)
			pid, err := h.BackendPID(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c.ReachesServer, c.Incarnation = true, "2026-12-04 00:00:00+00@2026-12-04 00:00:00+00"
			takeTracked(t, ctx, c, h, namedKey{K1: 75}, "end.go:1")
			c.MarkLostOn(pid, "died", errors.New("gone"), tc.flags)
			if queued := !h.ends.Empty(); queued != tc.queued {
				t.Fatalf("backend queued to be ended: %v, want %v", queued, tc.queued)
			}
			if tc.queued && !strings.Contains(h.reports[0].Backend, "ended where it still holds") {
				t.Fatalf("the report says %q of the backend", h.reports[0].Backend)
			}
			rawconn.Exec(context.Background(), h.inner, "SELECT pg_advisory_unlock_all()")
		})
	}
}

package pgsession

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// testHost is a real driver connection as a Conn's host: its own
// statements run on it; what the caller's database would do is counted.
type testHost struct {
	inner    driver.Conn
	raw      *sql.DB // the same database, for looking from outside
	c        *Conn[namedKey]
	inTx     bool
	marker   string
	poolers  atomic.Int32 // SawPooler calls
	settled  atomic.Int32
	lost     atomic.Int32
	holdEnds atomic.Int32
	rerouted atomic.Int32
	lockLost atomic.Int32
	reports  []Loss // (one goroutine)
	ends     *EndQueue
}

func (h *testHost) String() string      { return "test connection" }
func (h *testHost) Unwrap() driver.Conn { return h.inner }
func (h *testHost) ExecOwn(ctx context.Context, q string) error {
	return rawconn.Exec(ctx, h.inner, q)
}

func (h *testHost) BackendPID(ctx context.Context) (int32, error) {
	if pid := h.c.PID.Load(); pid != 0 {
		return pid, nil
	}
	pid, err := h.QueryValue(ctx, "SELECT pg_backend_pid()")
	if err != nil {
		return 0, err
	}
	h.c.PID.Store(int32(pgdriver.AsInt64(pid)))
	return h.c.PID.Load(), nil
}
func (h *testHost) InTx() bool              { return h.inTx }
func (h *testHost) Observe(err error) error { return err }
func (h *testHost) SessionMarker() string   { return h.marker }
func (h *testHost) PoolerDetected(what string) error {
	return fmt.Errorf("pooler: the connection %s", what)
}
func (h *testHost) SawPooler(error)               { h.poolers.Add(1) }
func (h *testHost) ConnectionBroken(e error) bool { return errors.Is(e, driver.ErrBadConn) }
func (h *testHost) LoseLocks(error) error         { h.lost.Add(1); return nil }
func (h *testHost) Settle()                       { h.settled.Add(1) }
func (h *testHost) ReleaseTurn(int64)             {}
func (h *testHost) HoldEnded(time.Time)           { h.holdEnds.Add(1) }
func (h *testHost) QueryValue(ctx context.Context, q string, args ...driver.NamedValue) (driver.Value, error) {
	row, err := h.QueryRow(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return row[0], nil
}
func (h *testHost) QueryRow(ctx context.Context, q string, args []driver.NamedValue) ([]driver.Value, error) {
	rows, err := rawconn.Query(ctx, h.inner, q, args)
	if err != nil {
		return nil, err
	}
	row, err := rawconn.ReadRow(rows)
	if err != nil {
		return nil, err
	}
	return row.Values(), nil
}
func (h *testHost) UnlockRerouted(context.Context) { h.rerouted.Add(1) }
func (h *testHost) ThroughPooler() bool            { return h.c.set.TxPooler || h.c.set.PinningPooler }
func (h *testHost) Ends() *EndQueue                { return h.ends }
func (h *testHost) ReportLoss(l Loss)              { h.reports = append(h.reports, l) }
func (h *testHost) LockLost()                      { h.lockLost.Add(1) }
func (h *testHost) LoseIfReleased(string)          {}
func (h *testHost) TxBegun() bool                  { return false }

// reconcileEnv returns a Conn over a real driver connection, and a pool
// on the same database for acting beside it.
func reconcileEnv(t *testing.T, set Settings) (context.Context, *Conn[namedKey], *testHost) {
	ctx, raw, open := holderEnv(t)
	h := &testHost{inner: open(), raw: raw, ends: NewEndQueue()}
	t.Cleanup(func() { h.inner.Close() })
	h.c = new(Conn[namedKey])
	if set.Own == nil {
		set.Own = new(pgdriver.Statements)
	}
	set.Own.Of(h.inner)
	set.CheckTimeout, set.Logger = 10*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil))
	h.c.Init(&set, h)
	h.c.Who = NewIdentity(1, "test", 1)
	return ctx, h.c, h
}

// Reconcile makes the tracking what pg_locks says: a lock taken behind
// lockhooks' back is learnt (approximate, at the site given), one
// released behind its back is forgotten, and a freed hold is recorded.
func TestReconcileReadsTheServer(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	if err := rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_lock(41), pg_advisory_lock_shared(42)"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconcile(ctx, "found.go:1", nil, true); err != nil {
		t.Fatal(err)
	}
	x, s := namedKey{K1: 41}, namedKey{K1: 42, Shared: true}
	c.Lock()
	lx, ls := c.Held[x], c.Held[s]
	c.Unlock()
	if lx == nil || ls == nil || lx.Site != "found.go:1" || !lx.Approx {
		t.Fatalf("after the read: key 41 %+v, shared 42 %+v; want both learnt at found.go:1, approximate", lx, ls)
	}
	if !c.Active.Load() {
		t.Fatal("a connection that holds session locks is not on the slow path")
	}
	if err := rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconcile(ctx, "", nil, false); err != nil {
		t.Fatal(err)
	}
	c.Lock()
	n := len(c.Held)
	c.Unlock()
	if n != 0 || h.holdEnds.Load() != 2 {
		t.Fatalf("after unlock_all: %d locks tracked, %d holds ended; want 0 and 2", n, h.holdEnds.Load())
	}
	if h.poolers.Load() != 0 {
		t.Fatal("a direct connection was taken for a pooler's")
	}
}

// Inside a transaction the read runs in a savepoint: a read that works,
// and one that fails (here: answered by another backend than the
// connection's), leave the application's transaction usable, and a
// transaction-level lock is tracked as the transaction's.
func TestReconcileInTransactionKeepsItUsable(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	pid, err := h.BackendPID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rawconn.Exec(ctx, h.inner, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	h.inTx = true
	if err := rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_xact_lock(5)"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconcile(ctx, "tx.go:2", map[namedKey]int{{K1: 5}: -1}, false); err != nil {
		t.Fatal(err)
	}
	c.Lock()
	xact, held := c.Xact[namedKey{K1: 5}], len(c.Held)
	c.Unlock()
	if xact != 1 || held != 0 {
		t.Fatalf("a transaction-level lock: xact count %d, %d session locks; want 1 and 0", xact, held)
	}
	if err := rawconn.Exec(ctx, h.inner, "SELECT 1"); err != nil {
		t.Fatalf("the transaction is unusable after a read: %v", err)
	}
	c.PID.Store(pid + 100000)
	if _, err := c.ReadLocks(ctx); err == nil {
		t.Fatal("a read answered by another backend did not fail")
	}
	if err := rawconn.Exec(ctx, h.inner, "SELECT 1"); err != nil {
		t.Fatalf("the transaction is unusable after a failed read: %v", err)
	}
	if err := rawconn.Exec(ctx, h.inner, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
}

// A backend that answers for another pid proves a pooler; through a
// session-pinning pooler the backend that answers becomes the
// connection's, and pins it once it holds session locks.
func TestReadLocksChecksTheBackend(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	if _, err := h.BackendPID(ctx); err != nil {
		t.Fatal(err)
	}
	own := c.PID.Load()
	c.PID.Store(own + 100000) // as if opened on another backend
	if _, err := c.ReadLocks(ctx); err == nil || h.poolers.Load() != 1 {
		t.Fatalf("a read answered by another backend: %v, %d poolers seen; want a pooler's error", err, h.poolers.Load())
	}

	ctx, c, h = reconcileEnv(t, Settings{PinningPooler: true})
	c.PID.Store(1) // anything: the pooler's backend is followed
	if err := rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_lock(9)"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadLocks(ctx); err != nil {
		t.Fatal(err)
	}
	c.Lock()
	pinned := c.PinnedTo
	c.Unlock()
	if pinned == 0 || c.PID.Load() != pinned {
		t.Fatalf("through a pinning pooler: pinned to %d, pid %d; want the backend that answered", pinned, c.PID.Load())
	}
	if err := c.FollowPin(pinned+1, false); err == nil {
		t.Fatal("a pinned connection that moved was not reported")
	}
}

// A connection whose holdings are unknown is read again; one that holds
// nothing is not read at all.
func TestVerifyUnknown(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	if !c.VerifyUnknown(ctx) || h.settled.Load() != 0 {
		t.Fatal("a connection lockhooks does not follow was read")
	}
	if err := rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_lock(3)"); err != nil {
		t.Fatal(err)
	}
	c.MarkUnverified()
	if !c.VerifyUnknown(ctx) || h.settled.Load() != 1 {
		t.Fatalf("an unverified connection: settled %d times; want once, known", h.settled.Load())
	}
	c.Lock()
	l, unverified := c.Held[namedKey{K1: 3}], c.Unverified
	c.Unlock()
	if l == nil || unverified {
		t.Fatalf("after the check: key 3 %+v, unverified %v; want it learnt, verified", l, unverified)
	}
}

// The plain read goes as the driver's cached statement (pgx prepares it
// once on the session); a holder's read, whose text changes with every
// hold, is annotated and goes uncached (the statements' own arguments,
// Settings.Own), so it never enters the session's prepared statements.
func TestReadOwnLocksAnnotates(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	pid, err := h.BackendPID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prepared := func(text string) int64 {
		t.Helper()
		n, err := h.QueryValue(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", driver.NamedValue{Ordinal: 1, Value: text})
		if err != nil {
			t.Fatal(err)
		}
		return n.(int64)
	}
	if held, ranOn, _, err := c.readOwnLocks(ctx, pid); err != nil || len(held) != 0 || ranOn != pid {
		t.Fatalf("read of an idle backend: %v on %d, %v", held, ranOn, err)
	}
	plain, _ := c.OwnLocksQuery(pid, 0, true)
	if n := prepared(plain); n != 1 {
		t.Fatalf("the plain read is prepared %d times on the session, want once (cached)", n)
	}
	c.Lock()
	c.AddLocked(namedKey{K1: 8}, "a.go:1", noSpan, 1)
	c.Unlock()
	if err := rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_lock(8)"); err != nil {
		t.Fatal(err)
	}
	held, _, _, err := c.readOwnLocks(ctx, pid)
	if err != nil || len(held) != 1 || held[0] != (namedKey{K1: 8}) {
		t.Fatalf("read of a holder: %v, %v; want key 8", held, err)
	}
	annotated, isAnnotated := c.OwnLocksQuery(pid, 0, true)
	if !isAnnotated || identity.ParseAnnotation(annotated) == nil {
		t.Fatalf("a holder's read %q is not annotated", annotated)
	}
	if n := prepared(annotated); n != 0 {
		t.Fatalf("a holder's annotated read was prepared on the session (%d): it would fill the driver's statement cache", n)
	}
}

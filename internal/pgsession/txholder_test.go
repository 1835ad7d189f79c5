package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// host is a connection as its TxHolder sees it: it counts the losses and
// the savepoints ended, and holds what the test says.
type host struct {
	mu       sync.Mutex
	lost     []int32
	released int
	nothing  bool
}

func (h *host) String() string { return "connection #1" }
func (h *host) HolderLost(pid int32, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lost = append(h.lost, pid)
	return fmt.Errorf("lost on backend %d: %w", pid, err)
}
func (h *host) ReleaseLockSavepoint(ctx context.Context, c driver.Conn) error {
	h.mu.Lock()
	h.released++
	h.mu.Unlock()
	return rawconn.Exec(ctx, c, "RELEASE SAVEPOINT lockhooks_lock")
}
func (h *host) HoldsNothing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nothing
}

// A TxHolder against a real server (no pooler is needed for its own
// mechanics): a lock statement runs on the holder in a savepoint, so that
// a failed one leaves the holder's transaction and its other locks
// intact; a blocking lock polls until the key is free and stops when the
// database closes; a holder whose backend is gone is dropped and its loss
// reported, with its pid.
func TestTxHolder(t *testing.T) {
	ctx, raw, open := holderEnv(t)
	closing := make(chan struct{})
	db := &TxPooler{Settings: &Settings{CheckTimeout: 5 * time.Second, Own: new(pgdriver.Statements)}, Closing: closing,
		Connect: func(context.Context) (driver.Conn, error) { return open(), nil }}
	h := &host{}
	var th TxHolder
	th.Init(db, h)
	defer th.Shut()

	if _, err := th.Run(ctx, "SELECT pg_advisory_lock(11)", nil); err != nil {
		t.Fatal(err)
	}
	pid := th.PID()
	if pid == 0 || h.released != 1 {
		t.Fatalf("after a lock on the holder: pid %d, savepoints released %d", pid, h.released)
	}
	// A failed statement rolls back to its savepoint: the holder's
	// transaction goes on (a session lock would outlive an aborted one
	// anyway: the next statement tells), nothing is lost.
	if _, err := th.Run(ctx, "SELECT pg_advisory_lock(1/0)", nil); err == nil {
		t.Fatal("a failing statement succeeded")
	}
	if _, err := th.Run(ctx, "SELECT 1", nil); err != nil || !th.InTx() || th.PID() != pid || len(h.lost) != 0 {
		t.Fatalf("after a failed statement: next statement %v, in a transaction %v, pid %d (was %d), losses %v", err, th.InTx(), th.PID(), pid, h.lost)
	}
	var held bool
	if err := raw.QueryRowContext(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = 11 AND pid = $1)", pid).Scan(&held); err != nil || !held {
		t.Fatalf("after a failed statement the holder's lock is held: %v, %v", held, err)
	}
	if err := th.Check(ctx); err != nil {
		t.Fatal(err)
	}

	// A blocking lock polls while another session holds the key.
	other, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.ExecContext(ctx, "SELECT pg_advisory_lock(12)"); err != nil {
		t.Fatal(err)
	}
	polled := make(chan error, 1)
	go func() { polled <- th.PollLock(ctx, "SELECT pg_try_advisory_lock(12)", nil) }()
	select {
	case err := <-polled:
		t.Fatalf("PollLock returned %v while another session holds the key", err)
	case <-time.After(50 * time.Millisecond): // (only a chance to fail early: the result is checked below)
	}
	if _, err := other.ExecContext(ctx, "SELECT pg_advisory_unlock(12)"); err != nil {
		t.Fatal(err)
	}
	if err := <-polled; err != nil {
		t.Fatalf("PollLock after the key was freed: %v", err)
	}

	// db.Close ends a wait.
	if _, err := other.ExecContext(ctx, "SELECT pg_advisory_lock(13)"); err != nil {
		t.Fatal(err)
	}
	go func() { polled <- th.PollLock(ctx, "SELECT pg_try_advisory_lock(13)", nil) }()
	close(closing)
	if err := <-polled; !errors.Is(err, ErrClosing) {
		t.Fatalf("PollLock as the database closes: %v, want ErrClosing", err)
	}

	// A holder whose backend is gone is dropped, its loss reported.
	pid = th.PID()
	if _, err := raw.ExecContext(ctx, "SELECT pg_terminate_backend($1, 10000)", pid); err != nil { // (waits until it is gone)
		t.Fatal(err)
	}
	if err := th.Check(ctx); err == nil {
		t.Fatal("Check passed on a holder whose backend was ended")
	}
	if len(h.lost) != 1 || h.lost[0] != pid || th.Conn() != nil || th.PID() != 0 {
		t.Fatalf("after the holder's backend ended: losses %v (want [%d]), connection kept %v, pid %d", h.lost, pid, th.Conn() != nil, th.PID())
	}
	if err := th.Check(ctx); err != nil {
		t.Fatalf("Check without a holder: %v", err)
	}

	// With nothing held, EndIfEmpty ends the holder's transaction.
	if _, err := th.Run(ctx, "SELECT pg_try_advisory_lock(14)", nil); err != nil {
		t.Fatal(err)
	}
	h.nothing = true
	th.EndIfEmpty()
	if th.InTx() || th.Conn() == nil {
		t.Fatalf("after EndIfEmpty with nothing held: in a transaction %v, connection kept %v", th.InTx(), th.Conn() != nil)
	}
}

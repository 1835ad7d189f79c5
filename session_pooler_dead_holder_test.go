package lockhooks

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Review 3, finding 4: through PgBouncer in session mode (one server
// connection, so the monitor's check must get the holder's), a parked
// holder's connection dies. PgBouncer resets its server connection and
// hands it to the next client, the monitor's check, which so runs on the
// holder's backend: that proves a dead connection, not a transaction-mode
// pooler. The lock is lost for that reason, and the database still takes
// session locks (a transaction-mode pooler would have made it refuse them).
func TestSessionPoolerDeadParkedHolderIsNotATransactionPooler(t *testing.T) {
	ctx := context.Background()
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{Mode: "session", PoolSize: 1})
	proxied, proxy := throughFaultProxy(t, e.pooled)
	db, err := Open("pgx", withApp(proxied, e.app), WithLockCheckInterval(50*time.Millisecond), withCheckTimeout(5*time.Second),
		WithLogger(slog.New(slog.NewTextHandler(e.log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	sc, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	holder := stateOf(t, sc)
	if _, err := sc.ExecContext(ctx, "SELECT pg_advisory_lock(4343)"); err != nil {
		t.Fatal(err)
	}
	s1 := holder.lockPID()
	sc.Close() // parked: it holds the lock
	waitFor(t, 10*time.Second, "the holder to be parked", func() bool {
		holder.pin.mu.Lock()
		defer holder.pin.mu.Unlock()
		return holder.pin.parked
	})

	// The holder's connection dies: PgBouncer resets S1 for the next client.
	for _, l := range proxy.Links() {
		l.Cut()
	}
	waitFor(t, 20*time.Second, "the parked holder to be reported lost", func() bool {
		holder.pin.mu.Lock()
		defer holder.pin.mu.Unlock()
		return holder.pin.lost != nil || holder.pin.closed
	})
	log := e.log.String()
	if strings.Contains(log, "transaction-mode pooler") {
		t.Fatalf("a dead holder behind a session pooler was taken for a transaction-mode pooler (backend %d):\n%s", s1, log)
	}
	if !strings.Contains(log, "advisory lock lost") {
		t.Errorf("the loss was not logged:\n%s", log)
	}
	if err := db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	c2, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.ExecContext(ctx, "SELECT pg_advisory_lock(4343)"); err != nil {
		t.Fatalf("the database refuses session locks after a dead holder: %v", err)
	}
	if _, err := c2.ExecContext(ctx, "SELECT pg_advisory_unlock(4343)"); err != nil && !errors.Is(err, ErrLockLost) {
		t.Fatal(err)
	}
}

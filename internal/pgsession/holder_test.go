package pgsession

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// holderEnv opens a database for t and returns a pool on it, for looking
// at the holder from outside, and a way to open driver connections to it,
// for holders.
func holderEnv(t *testing.T) (context.Context, *sql.DB, func() driver.Conn) {
	dsn := pgtest.DSN(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx, raw, func() driver.Conn {
		c, err := stdlib.GetDefaultDriver().Open(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// A holder against a real server: Begin reads the backend its transaction
// runs on, a session lock taken there survives nothing but EndTx (which
// releases it and commits), and Drop forgets the connection and its pid.
func TestHolderLifecycle(t *testing.T) {
	ctx, raw, open := holderEnv(t)
	inner := open()
	var h Holder
	if h.InTx() || h.PID() != 0 || h.Conn() != nil {
		t.Fatal("a zero Holder is not empty")
	}
	h.Open(inner)
	// (pgx runs "SELECT …; BEGIN" in one round trip: Begin's first path)
	if err := h.Begin(ctx, new(pgdriver.Statements).Of(inner)); err != nil {
		t.Fatal(err)
	}
	pid := h.PID()
	var state string
	if err := raw.QueryRowContext(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state); err != nil || state != "idle in transaction" {
		t.Fatalf("backend %d after Begin: %q, %v; want idle in transaction", pid, state, err)
	}
	held := func() bool {
		var n int
		if err := raw.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if err := rawconn.Exec(ctx, h.Conn(), "SELECT pg_advisory_lock(77)"); err != nil {
		t.Fatal(err)
	}
	if !held() || h.Ping(ctx) != nil {
		t.Fatal("the holder's lock is not held, or the holder does not answer")
	}
	h.EndTx(ctx)
	if h.InTx() || h.PID() != 0 || h.Conn() == nil || held() {
		t.Fatalf("after EndTx: in a transaction %v, pid %d, connection kept %v, lock still held %v", h.InTx(), h.PID(), h.Conn() != nil, held())
	}
	// (a driver that may not: BEGIN, then the read)
	if err := h.Begin(ctx, new(pgdriver.Statements)); err != nil {
		t.Fatal(err)
	}
	if got := h.Drop(); got != pid || h.Conn() != nil || h.InTx() || h.PID() != 0 {
		t.Fatalf("Drop returned %d (want %d); connection kept %v, in a transaction %v", got, pid, h.Conn() != nil, h.InTx())
	}
}

// A holder whose backend was ended cannot end its transaction: EndTx
// closes it, and a Begin on a connection whose server is gone leaves it
// out of a transaction.
func TestHolderWhoseBackendEnded(t *testing.T) {
	ctx, raw, open := holderEnv(t)
	inner := open()
	var h Holder
	h.Open(inner)
	if err := h.Begin(ctx, new(pgdriver.Statements)); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, "SELECT pg_terminate_backend($1)", h.PID()); err != nil {
		t.Fatal(err)
	}
	h.EndTx(ctx)
	if h.Conn() != nil || h.InTx() || h.PID() != 0 {
		t.Fatalf("after EndTx on an ended backend: connection kept %v, in a transaction %v, pid %d", h.Conn() != nil, h.InTx(), h.PID())
	}

	dead := open()
	h.Open(dead)
	rows, err := rawconn.Query(ctx, dead, "SELECT pg_backend_pid()", nil)
	if err != nil {
		t.Fatal(err)
	}
	row, err := rawconn.ReadRow(rows)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, "SELECT pg_terminate_backend($1)", row.Values()[0]); err != nil {
		t.Fatal(err)
	}
	if err := h.Begin(ctx, new(pgdriver.Statements)); err == nil {
		t.Fatal("Begin on an ended backend succeeded")
	}
	if h.InTx() || h.PID() != 0 {
		t.Errorf("after a failed Begin: in a transaction %v, pid %d", h.InTx(), h.PID())
	}
	h.Drop()
}

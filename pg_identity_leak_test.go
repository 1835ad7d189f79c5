package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Without WithTransactionPooler, a session lock taken through PgBouncer's
// transaction mode while the pool is idle is what the undeclared-pooler
// guard catches later. lockhooks sets nothing at session level for it (an
// application_name set there would stay on the server connection, which
// PgBouncer 1.18 then gives to clients that set none, and nothing could
// reset it): another application of the pooler runs under its own name,
// and a waiter blocked by it is not told it is a lockhooks connection. The
// DSN names no application, so lockhooks publishes identities.
func TestUndeclaredPoolerLeaksNoApplicationName(t *testing.T) {
	for _, v := range pgtest.Versions {
		t.Run(v.String(), func(t *testing.T) {
			ctx := context.Background()
			e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{Version: v, PoolSize: 1})
			log := &syncBuffer{}
			// No application_name in the DSN: lockhooks publishes identities.
			l, err := Open("pgx", e.pooled, WithLockCheckInterval(50*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(log, nil))))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c, err := l.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			mustExec(t, c, "SELECT pg_advisory_lock(7)")
			// The guard may or may not have caught the pooler by now; either
			// way the lock (and the setting) stay on the only server connection.
			c.ExecContext(ctx, "SELECT 1")
			c.Close()
			// The guard catches it before another client takes the only
			// server connection (its check needs one): until then lockhooks
			// takes the backend for its connection's, and would name that
			// connection as the holder of what the backend holds next.
			pins := connectorOf(t, l).pins
			waitFor(t, 10*time.Second, "the guard to see the pooler", func() bool { return pins.PoolerSeen() != nil })

			// Another application, no application_name, through the same pooler.
			other, err := sql.Open("pgx", e.pooled)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			var app string
			var pid int32
			if err := other.QueryRow("SELECT current_setting('application_name'), pg_backend_pid()").Scan(&app, &pid); err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(app, identity.AppNamePrefix) {
				t.Errorf("another client of the pooler (backend %d) runs with lockhooks' application_name %q", pid, app)
			}

			// That application holds key 99 in a transaction; a lockhooks
			// waiter (direct, another *sql.DB of this process) is told who.
			tx, err := other.Begin()
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.Exec("SELECT pg_advisory_xact_lock(99)"); err != nil {
				t.Fatal(err)
			}
			w, err := Open("pgx", e.direct)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err = AcquireAdvisoryLock(wctx, w, 99)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("waiter: %v", err)
			}
			if strings.Contains(err.Error(), "connection #") {
				t.Errorf("the waiter names a lockhooks connection as the holder; the holder is another application's plain transaction:\n%v", err)
			}
			tx.Rollback()
			other.Close()
			// Clean up what the leaked session lock left on the pooler's backend.
			mustExec(t, e.raw, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1", pid)
		})
	}
}

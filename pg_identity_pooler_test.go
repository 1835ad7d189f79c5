package lockhooks

import (
	"context"
	"database/sql"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// What PgBouncer (1.18, the Debian package the tests run) does with
// application_name, which is why lockhooks sets it only for a transaction
// (SET LOCAL semantics): PgBouncer restores a client's own application_name
// when it links it to a server connection, but a client that never set one
// gets whatever the server connection last had, so a session-level value
// would leak to other applications. A transaction-local one never does.
// (PgBouncer 1.25.2, checked by hand, also resets nameless clients to the
// empty name.)
func TestPoolerApplicationNameIsTransactionLocal(t *testing.T) {
	p := pgtest.StartPooler(t, pgtest.PoolerOptions{PoolSize: 1}) // one server connection, shared by all
	dsn := p.DSN(t)
	db := openDSN(t, dsn, WithTransactionPooler())
	other := openRaw(t, dsn)
	ctx := context.Background()
	appOf := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) string {
		var app string
		if err := q.QueryRowContext(ctx, "SELECT current_setting('application_name')").Scan(&app); err != nil {
			t.Fatal(err)
		}
		return app
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if app := appOf(tx); !strings.HasPrefix(app, identity.AppNamePrefix) || !strings.Contains(app, " tx ") {
		t.Errorf("in lockhooks' transaction: application_name %q", app)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if app := appOf(other); app != "" {
		t.Errorf("another application, nameless, on the same server connection after lockhooks' transaction: application_name %q, want empty", app)
	}
	// A session lock through the declared pooler: its holder connection's
	// transaction carries the identity, for the lock's lifetime only. (Not
	// AcquireAdvisoryLock: its fencing token is read on a second server
	// connection, and this pool has one.)
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"SELECT pg_advisory_lock(77)", "SELECT pg_advisory_unlock(77)"} {
		if _, err := c.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if app := appOf(other); app != "" {
		t.Errorf("another application after a session lock was held and released: application_name %q, want empty", app)
	}
}

// Issue 21, point 13: through a pooler a server backend serves many
// clients, so the backend a connection met at connect may run another
// application's statement later. The debug page shows a wait as this
// database's only where the backend's identity says it is this database's
// connection, and shows this database's own wait on the backend it really
// runs on.
func TestDebugPageThroughPoolerShowsOnlyItsOwnWaits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		declared bool   // WithTransactionPooler
		otherApp string // the other application's application_name
	}{
		{"declared pooler, nameless other application", true, ""},
		{"undeclared pooler, other application named", false, "otherapp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Four server connections: the holder's, the one lockhooks'
			// connection meets at connect (then the other application's), the
			// one its transaction gets, and the page's side connection's.
			p := pgtest.StartPooler(t, pgtest.PoolerOptions{PoolSize: 4})
			dsn := p.DSN(t)
			raw := openRaw(t, pgtest.DSN(t)) // pg_stat_activity, outside the pooler
			mustExec(t, openRaw(t, dsn), "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)")
			ctx := context.Background()
			backendOf := func(marker string) int32 {
				var pid int32
				waitFor(t, 20*time.Second, "a backend waiting in "+marker, func() bool {
					return raw.QueryRow("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'", marker).Scan(&pid) == nil
				})
				return pid
			}

			// 1. Someone holds the row.
			holder, err := openRaw(t, dsn).BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec("UPDATE t SET v = 1 WHERE id = 1"); err != nil {
				t.Fatal(err)
			}
			// 2. lockhooks' connection opens on the one idle server
			// connection, and gives it back.
			var opts []Option
			if tc.declared {
				opts = append(opts, WithTransactionPooler())
			}
			db := openDSN(t, dsn, opts...)
			srv := httptest.NewServer(DebugHandler(db))
			defer srv.Close()
			debugJSON(t, srv) // resolves the database through its connection
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			connectPID := connPID(t, c)
			// 3. Another application's transaction gets that server
			// connection (PgBouncer reuses the last released first) and waits
			// for the row.
			otherDSN := dsn
			if tc.otherApp != "" {
				otherDSN = withDSNParam(t, dsn, "application_name", tc.otherApp)
			}
			// The waits end when the holder does (or after a minute).
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			var waits sync.WaitGroup
			defer waits.Wait()
			defer holder.Rollback()
			otherTx, err := openRaw(t, otherDSN).BeginTx(wctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			waits.Go(func() {
				otherTx.ExecContext(wctx, "UPDATE t SET v = 2 WHERE id = 1 /* other application */")
				otherTx.Rollback()
			})
			if pid := backendOf("other application"); pid != connectPID {
				t.Fatalf("the other application waits on backend %d, not on %d, the one lockhooks' connection met at connect", pid, connectPID)
			}
			// 4. lockhooks' connection waits for the row too, in a
			// transaction, on another server connection.
			tx, err := c.BeginTx(wctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			waits.Go(func() {
				tx.ExecContext(wctx, "UPDATE t SET v = 3 WHERE id = 1 /* this database */")
				tx.Rollback()
			})
			ours := backendOf("this database")

			rep, body := debugJSON(t, srv)
			d := rep.Databases[0]
			if strings.Contains(body, `"statement": "UPDATE t SET v = 2`) {
				t.Errorf("the page shows the other application's statement as a wait of this database:\n%s", body)
			}
			if len(d.Waiters) != 1 || d.Waiters[0].PID != ours || !strings.Contains(d.Waiters[0].Statement, "this database") {
				t.Errorf("waiters %+v; want one, on backend %d (this database's statement)", d.Waiters, ours)
			}
		})
	}
}

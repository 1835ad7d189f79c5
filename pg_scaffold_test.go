package lockhooks

// The connection setup the Postgres tests share: opening databases with and
// without lockhooks, naming a connection's backend, reading and ending
// backends, running a statement that must succeed, and waiting for a
// condition, and a fault proxy in front of a server (throughFaultProxy).
// Child processes are in child_process_test.go.

import (
	"context"
	"database/sql"
	"net/url"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// openPG opens a fresh Postgres database through sql.Open("lockhooks+pgx"),
// or through Open when options are given; closed when t ends.
func openPG(t testing.TB, opts ...Option) *sql.DB {
	t.Helper()
	dsn := pgtest.DSN(t)
	var db *sql.DB
	if len(opts) == 0 {
		name, err := Register("pgx")
		if err != nil {
			t.Fatal(err)
		}
		db, err = sql.Open(name, dsn)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		var err error
		if db, err = Open("pgx", dsn, opts...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openDSN opens dsn through lockhooks; closed when t ends.
func openDSN(t testing.TB, dsn string, opts ...Option) *sql.DB {
	t.Helper()
	db, err := Open("pgx", dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openRaw opens dsn with pgx, without lockhooks; closed when t ends.
func openRaw(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// withDSNParam returns dsn (a URL, or key=value pairs) with parameter k
// set to v.
func withDSNParam(t testing.TB, dsn, k, v string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return dsn + " " + k + "=" + v
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// otherConn takes a connection out of db's pool, so the next db call runs
// on a different one; closed when t ends.
func otherConn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// connPID returns the backend pid lockhooks knows for c (read at connect).
func connPID(t testing.TB, c *sql.Conn) int32 {
	t.Helper()
	var pid int32
	if err := c.Raw(func(dc any) error { pid = dc.(connCore).state().pin.PID.Load(); return nil }); err != nil {
		t.Fatal(err)
	}
	return pid
}

// pidOf asks the server which backend c's next statement runs on.
func pidOf(t testing.TB, c *sql.Conn) int32 {
	t.Helper()
	var pid int32
	if err := c.QueryRowContext(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// activity reads a backend's application_name and last statement.
func activity(t testing.TB, raw *sql.DB, pid int32) (app, query string) {
	t.Helper()
	if err := raw.QueryRow("SELECT application_name, query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&app, &query); err != nil {
		t.Fatalf("pg_stat_activity of backend %d: %v", pid, err)
	}
	return app, query
}

// backendAlive reports whether backend pid is connected.
func backendAlive(t testing.TB, raw *sql.DB, pid int32) bool {
	t.Helper()
	var n int
	if err := raw.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// terminate ends backend pid with pg_terminate_backend, as a DBA would.
func terminate(t testing.TB, raw *sql.DB, pid int32) {
	t.Helper()
	var ok bool
	if err := raw.QueryRow("SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
	}
}

// mustExec runs query on db (a *sql.DB, *sql.Conn or *sql.Tx) and fails
// the test if it fails.
func mustExec(t testing.TB, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// here returns file:line of its caller plus delta lines, as lockhooks
// names call sites.
func here(delta int) string {
	_, file, line, _ := runtime.Caller(1)
	return callsite.ShortFile(file) + ":" + strconv.Itoa(line+delta)
}

// throughFaultProxy starts a fault-injecting proxy in front of dsn's host,
// closed when t ends (if not before), and returns dsn through it.
func throughFaultProxy(t testing.TB, dsn string) (string, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	return u.String(), proxy
}

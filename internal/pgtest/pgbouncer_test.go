package pgtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/testcaps"
)

func openPooled(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// clientConn is one client connection to PgBouncer, kept for the whole test.
func clientConn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func backendPID(t *testing.T, q queryer) int {
	t.Helper()
	var pid int
	if err := q.QueryRowContext(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// dbName is the database in dsn.
func dbName(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// direct opens the database of pooled DSN dsn without PgBouncer.
func direct(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	return openPooled(t, withDatabase(adminTo, dbName(t, dsn)))
}

// withParam returns dsn with the query parameter k set to v.
func withParam(t *testing.T, dsn, k, v string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestPoolerQuery(t *testing.T) { EachPooler(t, testPoolerQuery) }

func testPoolerQuery(t *testing.T, p *Pooler) {
	dsn := p.DSN(t)
	if exec := strings.Contains(dsn, "default_query_exec_mode=exec"); exec == p.KeepsPreparedStatements() {
		t.Errorf("%v: DSN %s; want default_query_exec_mode=exec exactly where prepared statements are not kept", p.Version(), dsn)
	}
	db := openPooled(t, dsn)
	var name string
	var n int
	if err := db.QueryRow("SELECT current_database(), $1::int + 1", 41).Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	if n != 42 {
		t.Errorf("got %d, want 42", n)
	}
	if want := dbName(t, dsn); name != want {
		t.Errorf("current_database() = %s, want %s", name, want)
	}
	var mode string
	for _, pool := range p.Show(t, "POOLS") {
		if pool["database"] == name {
			mode = pool["pool_mode"]
		}
	}
	if mode != "transaction" {
		t.Errorf("SHOW POOLS: pool_mode of %s = %q, want transaction", name, mode)
	}
	rows := p.Show(t, "VERSION")
	if len(rows) != 1 || !strings.HasPrefix(rows[0]["version"], "PgBouncer "+string(p.Version())+".") {
		t.Errorf("SHOW VERSION = %v, want PgBouncer %s", rows, p.Version())
	}
}

// Two client connections each run a transaction at the same time, on two
// server backends.
func TestPoolerTwoTransactions(t *testing.T) { EachPooler(t, testPoolerTwoTransactions) }

func testPoolerTwoTransactions(t *testing.T, p *Pooler) {
	db := openPooled(t, p.DSN(t))
	ctx := context.Background()
	a, b := clientConn(t, db), clientConn(t, db)
	txA, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	txB, err := b.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txA.Exec("CREATE TABLE a (id int)"); err != nil {
		t.Fatal(err)
	}
	if _, err := txB.Exec("CREATE TABLE b (id int)"); err != nil {
		t.Fatal(err)
	}
	if pa, pb := backendPID(t, txA), backendPID(t, txB); pa == pb {
		t.Errorf("two open transactions share backend %d", pa)
	}
	if err := txA.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := txB.Commit(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_tables WHERE tablename IN ('a', 'b')").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%d of the two tables committed", n)
	}
}

// handOver is the deterministic recipe that moves client connection a to
// another server backend, in a fresh database (its own PgBouncer pool, empty)
// with default_pool_size = 2 and server_round_robin = 0 (LIFO):
//
//  1. a runs a statement outside a transaction: it gets server S1 (the only
//     one: PgBouncer opens it when the first client logs in) and gives it
//     back when the statement ends;
//  2. b runs BEGIN and a statement: it gets S1, the only idle server, and
//     keeps it until its transaction ends;
//  3. a runs its next statement: no server is idle and the pool is below 2,
//     so PgBouncer opens S2 for a.
//
// Then b's open transaction runs on the backend a used in step 1 (and on
// which any session state a left — advisory locks, prepared statements,
// SETs — lives), and a is on another one. handOver does step 2 and returns
// b's transaction; the caller does steps 1 and 3.
func handOver(t *testing.T, b *sql.Conn) *sql.Tx {
	t.Helper()
	tx, err := b.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	return tx
}

// A session-level advisory lock taken through the pooler stays on the server
// backend, which then serves another client's transaction, while the client
// that took it continues on another backend: server connections change hands.
func TestPoolerServerConnectionsChangeHands(t *testing.T) {
	EachPooler(t, testPoolerServerConnectionsChangeHands)
}

func testPoolerServerConnectionsChangeHands(t *testing.T, p *Pooler) {
	dsn := p.DSN(t)
	db := openPooled(t, dsn)
	ctx := context.Background()
	a, b := clientConn(t, db), clientConn(t, db)

	// Step 1.
	var s1 int
	if err := a.QueryRowContext(ctx, "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(42)) l").Scan(&s1); err != nil {
		t.Fatal(err)
	}
	// Step 2.
	txB := handOver(t, b)
	if got := backendPID(t, txB); got != s1 {
		t.Fatalf("b's transaction runs on backend %d, want %d (a's, the only idle server)", got, s1)
	}
	var mine bool
	if err := txB.QueryRow("SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = 42 AND pid = pg_backend_pid() AND granted)").Scan(&mine); err != nil {
		t.Fatal(err)
	}
	if !mine {
		t.Error("b's backend does not hold the advisory lock a took on it")
	}
	// Step 3.
	if s2 := backendPID(t, a); s2 == s1 {
		t.Fatalf("a is still on backend %d while b's transaction holds it", s1)
	}
	var unlocked bool
	if err := a.QueryRowContext(ctx, "SELECT pg_advisory_unlock(42)").Scan(&unlocked); err != nil {
		t.Fatal(err)
	}
	if unlocked {
		t.Error("a unlocked the advisory lock from another backend")
	}

	// PgBouncer's view: two server connections for the database, one
	// active (b's transaction), one idle (a's last statement ended).
	servers := map[string]int{}
	for _, s := range p.Show(t, "SERVERS") {
		if s["database"] == dbName(t, dsn) {
			servers[s["state"]]++
		}
	}
	if servers["active"] != 1 || servers["idle"] != 1 || len(servers) != 2 {
		t.Errorf("SHOW SERVERS for the database: %v, want 1 active and 1 idle", servers)
	}
}

// Named prepared statements (pgx's default exec mode, cache_statement) break
// once the server changes hands in PgBouncer 1.18; exec and simple_protocol
// do not. PgBouncer 1.25 with max_prepared_statements runs every mode.
func TestPoolerExecModes(t *testing.T) { EachPooler(t, testPoolerExecModes) }

func testPoolerExecModes(t *testing.T, p *Pooler) {
	for _, tc := range []struct {
		mode string
		ok   bool
	}{
		{"cache_statement", p.KeepsPreparedStatements()},
		{"cache_describe", true},
		{"describe_exec", true},
		{"exec", true},
		{"simple_protocol", true},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			db := openPooled(t, withParam(t, p.DSN(t), "default_query_exec_mode", tc.mode))
			a, b := clientConn(t, db), clientConn(t, db)
			const q = "SELECT $1::int * 2, pg_backend_pid()"
			var n, s1, s2 int
			if err := a.QueryRowContext(context.Background(), q, 1).Scan(&n, &s1); err != nil {
				t.Fatal(err)
			}
			tx := handOver(t, b)
			var sb int
			if err := tx.QueryRow("SELECT pg_backend_pid()").Scan(&sb); err != nil {
				t.Fatal(err)
			}
			err := a.QueryRowContext(context.Background(), q, 2).Scan(&n, &s2)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("second query: %v", err)
			case tc.ok && n != 4:
				t.Errorf("second query = %d, want 4", n)
			case !tc.ok && err == nil:
				t.Errorf("second query worked on backend %d (first on %d, b on %d); want a failure", s2, s1, sb)
			case !tc.ok:
				t.Logf("as expected: %v", err)
			}
		})
	}
}

// PgBouncer tracks application_name per client and sets it on the server
// connection that runs the client's transaction.
func TestPoolerApplicationName(t *testing.T) { EachPooler(t, testPoolerApplicationName) }

func testPoolerApplicationName(t *testing.T, p *Pooler) {
	dsn := p.DSN(t)
	alpha := openPooled(t, withParam(t, dsn, "application_name", "alpha"))
	beta := openPooled(t, withParam(t, dsn, "application_name", "beta"))
	a, b := clientConn(t, alpha), clientConn(t, beta)
	ctx := context.Background()
	adminDB := direct(t, dsn)
	seen := func(pid int) string {
		t.Helper()
		var name string
		if err := adminDB.QueryRow("SELECT application_name FROM pg_stat_activity WHERE pid = $1", pid).Scan(&name); err != nil {
			t.Fatal(err)
		}
		return name
	}

	var s1 int
	var got string
	if err := a.QueryRowContext(ctx, "SELECT pg_backend_pid(), current_setting('application_name')").Scan(&s1, &got); err != nil {
		t.Fatal(err)
	}
	if got != "alpha" || seen(s1) != "alpha" {
		t.Errorf("a: application_name %q, in pg_stat_activity %q, want alpha", got, seen(s1))
	}
	tx := handOver(t, b)
	var sb int
	if err := tx.QueryRow("SELECT pg_backend_pid(), current_setting('application_name')").Scan(&sb, &got); err != nil {
		t.Fatal(err)
	}
	if sb != s1 {
		t.Fatalf("b's transaction on backend %d, want %d", sb, s1)
	}
	if got != "beta" || seen(s1) != "beta" {
		t.Errorf("b on a's former backend: application_name %q, in pg_stat_activity %q, want beta", got, seen(s1))
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if seen(s1) != "beta" {
		t.Errorf("idle backend shows %q, want beta (the last client's) until another client uses it", seen(s1))
	}
	// S1 is the most recently released server: a gets it back (LIFO).
	var s3 int
	if err := a.QueryRowContext(ctx, "SELECT pg_backend_pid(), current_setting('application_name')").Scan(&s3, &got); err != nil {
		t.Fatal(err)
	}
	if s3 != s1 || got != "alpha" || seen(s1) != "alpha" {
		t.Errorf("a again: backend %d (want %d), application_name %q, in pg_stat_activity %q, want alpha", s3, s1, got, seen(s1))
	}
	// A SET application_name is tracked too.
	if _, err := a.ExecContext(ctx, "SET application_name = 'gamma'"); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRowContext(ctx, "SELECT current_setting('application_name')").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "beta" {
		t.Errorf("b after a's SET: %q, want beta", got)
	}
	if err := a.QueryRowContext(ctx, "SELECT current_setting('application_name')").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "gamma" {
		t.Errorf("a after its SET: %q, want gamma", got)
	}
}

// A dedicated pooler with idle_transaction_timeout closes a client whose
// transaction idles, and its server backend with it: the locks go.
func TestStartPoolerIdleTransactionTimeout(t *testing.T) {
	EachPooler(t, func(t *testing.T, shared *Pooler) {
		p := StartPooler(t, PoolerOptions{Version: shared.Version(), IdleTransactionTimeout: 500 * time.Millisecond})
		testIdleTransactionTimeout(t, p)
	})
}

func testIdleTransactionTimeout(t *testing.T, p *Pooler) {
	dsn := p.DSN(t)
	holder := clientConn(t, openPooled(t, dsn))
	ctx := context.Background()
	tx, err := holder.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("SELECT pg_advisory_xact_lock(7)"); err != nil {
		t.Fatal(err)
	}
	// A direct connection waits for the lock: it gets it when PgBouncer has
	// closed the idle holder's server connection.
	other := direct(t, dsn)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := other.ExecContext(wctx, "SELECT pg_advisory_lock(7)"); err != nil {
		t.Fatalf("waiting for the idle holder's lock: %v", err)
	}
	if _, err := tx.Exec("SELECT 1"); err == nil {
		t.Error("the holder's transaction still works after idle_transaction_timeout")
	} else {
		t.Logf("holder after the timeout: %v", err)
	}
}

// A pooler whose test binary was killed is stopped and removed by the next.
func TestStalePoolerIsRemoved(t *testing.T) {
	needServer(t)
	if _, err := findPgBouncer(PgBouncer118); err != nil {
		poolerUnavailable(t, err)
	}
	p, err := startPooler(PoolerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.dir, ownerFile), []byte(strconv.Itoa(dead.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	removeStalePoolers()

	select {
	case <-p.proc.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the stale PgBouncer still runs")
	}
	if _, err := os.Stat(p.dir); !os.IsNotExist(err) {
		t.Errorf("stale pooler directory %s still exists (stat: %v)", p.dir, err)
	}
	if conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(p.port)); err == nil {
		conn.Close()
		t.Errorf("the stale PgBouncer still listens on port %d", p.port)
	}
}

// Without the binary a pooler test skips (unless PgBouncer is required).
func TestStartPoolerWithoutPgBouncerSkips(t *testing.T) {
	if os.Getenv(EnvRequirePgBouncer) == "1" {
		t.Skipf("%s=1: the test would fail, as it should", EnvRequirePgBouncer)
	}
	needServer(t)
	saved := pgbouncerBin
	pgbouncerBin = filepath.Join(t.TempDir(), "pgbouncer")
	t.Cleanup(func() { pgbouncerBin = saved })
	t.Setenv("PATH", t.TempDir())
	t.Setenv(EnvPgBouncer125, filepath.Join(t.TempDir(), "pgbouncer"))
	for _, v := range Versions {
		skipped := false
		t.Run(v.String(), func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			StartPooler(t, PoolerOptions{Version: v})
		})
		if !skipped {
			t.Errorf("StartPooler without PgBouncer %s did not skip", v)
		}
	}
	testcaps.Forget(t.Name()) // PgBouncer is missing on purpose: not for the report
}

// In session mode a client keeps its server connection, and the session
// locks on it, until it disconnects; PgBouncer then runs DISCARD ALL
// (server_reset_query), which releases them, before the next client gets
// that server connection.
func TestStartPoolerSessionMode(t *testing.T) {
	EachPooler(t, func(t *testing.T, shared *Pooler) {
		p := StartPooler(t, PoolerOptions{Version: shared.Version(), Mode: "session"})
		if p.Mode() != "session" {
			t.Fatalf("Mode() = %q", p.Mode())
		}
		dsn := p.DSN(t)
		db := openPooled(t, dsn)
		ctx := context.Background()
		a := clientConn(t, db)
		var s1 int
		if err := a.QueryRowContext(ctx, "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(42)) l").Scan(&s1); err != nil {
			t.Fatal(err)
		}
		// Another client's transaction cannot take a's server connection.
		b := clientConn(t, db)
		tx := handOver(t, b)
		if sb := backendPID(t, tx); sb == s1 {
			t.Fatalf("b's transaction runs on a's backend %d in session mode", s1)
		}
		tx.Rollback()
		if s2 := backendPID(t, a); s2 != s1 {
			t.Fatalf("a moved from backend %d to %d in session mode", s1, s2)
		}
		var unlocked bool
		if err := a.QueryRowContext(ctx, "SELECT pg_advisory_unlock(42)").Scan(&unlocked); err != nil || !unlocked {
			t.Fatalf("a's unlock on its own backend: %v, %v", unlocked, err)
		}
		for _, row := range p.Show(t, "POOLS") {
			if row["database"] == dbName(t, dsn) && row["pool_mode"] != "session" {
				t.Errorf("SHOW POOLS: pool_mode %q, want session", row["pool_mode"])
			}
		}
		// A lock left behind by a client that disconnects is released by
		// the reset query.
		if _, err := a.ExecContext(ctx, "SELECT pg_advisory_lock(43)"); err != nil {
			t.Fatal(err)
		}
		a.Raw(func(any) error { return driver.ErrBadConn }) // database/sql closes the connection
		a.Close()
		admin := direct(t, dsn)
		deadline := time.Now().Add(30 * time.Second)
		for {
			var n int
			if err := admin.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 43").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the disconnected client's session lock is still held")
			}
			time.Sleep(10 * time.Millisecond) // polling pg_locks, not timing
		}
		if !backendAlive(t, admin, s1) {
			t.Error("the server connection was closed instead of reset and kept")
		}
	})
}

func backendAlive(t *testing.T, db *sql.DB, pid int) bool {
	t.Helper()
	var alive bool
	if err := db.QueryRow("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	return alive
}

package lockhooks

import (
	"bufio"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/retry"
)

// A transaction kind whose COMMIT gets cut: what fn does, and its options.
type commitKind struct {
	name string
	opts *sql.TxOptions
	work []string // fn's statements
}

// commitKinds are transactions of every kind: ones that write, ones whose
// only effect is a NOTIFY (no transaction id until COMMIT, left alone),
// read-only ones that notify, ones that do nothing, and ones at an
// isolation level whose id is read before COMMIT (pgx).
var commitKinds = []commitKind{
	{"write", nil, []string{"INSERT INTO orders (note) VALUES ('once')"}},
	{"notify-only", nil, []string{"NOTIFY lockhooks_cut, 'once'"}},
	{"read-only-pg_notify", &sql.TxOptions{ReadOnly: true}, []string{"SELECT pg_notify('lockhooks_cut', 'once')"}},
	{"empty", nil, nil},
	{"serializable-write-and-notify", &sql.TxOptions{Isolation: sql.LevelSerializable}, []string{"INSERT INTO orders (note) VALUES ('once')", "NOTIFY lockhooks_cut, 'once'"}},
}

// cutCommitEnv is a database reached through a cuttingProxy, a listener on
// the channel lockhooks_cut, and a direct connection to count effects.
type cutCommitEnv struct {
	proxy  *cuttingProxy
	db     *sql.DB // lockhooks, through the proxy
	raw    *sql.DB // direct
	listen *pgx.Conn
}

func newCutCommitEnv(t *testing.T, driverName string) *cutCommitEnv {
	t.Helper()
	dsn := pgtest.DSN(t)
	proxy, proxied := newCuttingProxy(t, dsn)
	e := &cutCommitEnv{proxy: proxy}
	var err error
	if e.raw, err = sql.Open("pgx", dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.raw.Close() })
	mustExec(t, e.raw, "CREATE TABLE orders (id SERIAL PRIMARY KEY, note TEXT NOT NULL)")
	ctx := context.Background()
	if e.listen, err = pgx.Connect(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.listen.Close(context.Background()) })
	if _, err := e.listen.Exec(ctx, "LISTEN lockhooks_cut"); err != nil {
		t.Fatal(err)
	}
	if e.db, err = Open(driverName, proxied); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.db.Close() })
	return e
}

// effects counts the rows of orders and the notifications delivered on
// lockhooks_cut so far: a sentinel is notified last, and notifications
// arrive in commit order, so every earlier one has arrived with it.
func (e *cutCommitEnv) effects(t *testing.T) (rows, notified int) {
	t.Helper()
	mustExec(t, e.raw, "NOTIFY lockhooks_cut, 'sentinel'")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		n, err := e.listen.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("waiting for the sentinel notification: %v", err)
		}
		if n.Payload == "sentinel" {
			break
		}
		notified++
	}
	return countRows(t, e.raw, "orders"), notified
}

// run runs kind through RunInTx with the proxy armed, and returns RunInTx's
// error, the attempts and the retried errors.
func (e *cutCommitEnv) run(t *testing.T, kind commitKind, drop bool) (err error, attempts int, retried []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.proxy.drop.Store(drop)
	e.proxy.armed.Store(true)
	err = RunInTx(ctx, e.db, kind.opts, func(tx *sql.Tx) error {
		attempts++
		for _, q := range kind.work {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	}, OnRetry(func(ev RetryEvent) { retried = append(retried, ev.Err) }), CommitResolveTimeout(30*time.Second))
	if !e.proxy.cut.Load() {
		t.Fatal("the proxy never cut a COMMIT")
	}
	return err, attempts, retried
}

// wantOnce checks that kind's effects happened exactly once.
func (e *cutCommitEnv) wantOnce(t *testing.T, kind commitKind) {
	t.Helper()
	rows, notified := e.effects(t)
	wantRows, wantNotified := 0, 0
	for _, q := range kind.work {
		switch {
		case strings.HasPrefix(q, "INSERT"):
			wantRows++
		case strings.Contains(strings.ToLower(q), "notify"):
			wantNotified++
		}
	}
	if rows != wantRows || notified != wantNotified {
		t.Errorf("%d rows and %d notifications, want %d and %d: the transaction's effects must land exactly once", rows, notified, wantRows, wantNotified)
	}
}

// The connection breaks after COMMIT reached the server, for every kind
// of transaction: RunInTx learns from pg_xact_status that it committed,
// reports success, and does not run it again; its effects (rows, the
// NOTIFY of a transaction that had no id before COMMIT) land once. Through
// pgx and lib/pq.
func TestRunInTxCutCommitReplyEveryKind(t *testing.T) {
	for _, driverName := range []string{"pgx", "postgres"} {
		for _, kind := range commitKinds {
			t.Run(driverName+"/"+kind.name, func(t *testing.T) {
				e := newCutCommitEnv(t, driverName)
				err, attempts, retried := e.run(t, kind, false)
				if err != nil || attempts != 1 || len(retried) != 0 {
					t.Fatalf("RunInTx: %v after %d attempts (retried %v); want success after one", err, attempts, retried)
				}
				e.wantOnce(t, kind)
			})
		}
	}
}

// The connection breaks before COMMIT reached the server, and the network
// keeps the server's side open (black-holed): the backend waits, idle in
// the transaction, for a COMMIT that never comes. RunInTx finds it idle in
// its transaction, ends it, so the transaction aborts, and runs it again:
// the effects land once, long before the resolve timeout.
func TestRunInTxCommitLostBeforeTheServer(t *testing.T) {
	for _, driverName := range []string{"pgx", "postgres"} {
		for _, kind := range commitKinds {
			t.Run(driverName+"/"+kind.name, func(t *testing.T) {
				e := newCutCommitEnv(t, driverName)
				start := time.Now()
				err, attempts, retried := e.run(t, kind, true)
				if err != nil || attempts != 2 || len(retried) != 1 {
					t.Fatalf("RunInTx: %v after %d attempts (retried %v); want success after two", err, attempts, retried)
				}
				if msg := retried[0].Error(); !strings.Contains(msg, "aborted") {
					t.Errorf("the retried error does not say the first attempt aborted: %s", msg)
				}
				if d := time.Since(start); d > 20*time.Second {
					t.Errorf("resolving took %v: the idle backend was waited for, not ended", d)
				}
				e.wantOnce(t, kind)
			})
		}
	}
}

// beginInfo begins a transaction on db as RunInTx does and returns what
// the wrapped connection learnt at BEGIN, and the transaction's own view of
// its id and backend.
func beginInfo(t *testing.T, db *sql.DB, opts *sql.TxOptions) (info retry.CommitInfo, xid string) {
	t.Helper()
	ctx := context.WithValue(context.Background(), retry.InfoKey{}, &info)
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var v sql.NullString
	if err := tx.QueryRow("SELECT pg_current_xact_id_if_assigned()::text").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return info, v.String
}

// RunInTx's BEGIN assigns the transaction its id in BEGIN's own round
// trip where the driver allows it: lib/pq always, pgx at the default
// isolation level (its simple protocol returns only the first statement's
// rows, so the id is queried before BEGIN, which fixes the level). The
// transaction is then in the right mode. Other transactions read the id
// before COMMIT (RunInTx's fallback).
func TestRunInTxBeginLearnsTheTransactionID(t *testing.T) {
	dsn := pgtest.DSN(t)
	for _, tc := range []struct {
		driver, dsn string
		opts        *sql.TxOptions
		begun       bool
		level       string
	}{
		{"pgx", dsn, nil, true, "read committed"},
		{"pgx", dsn, &sql.TxOptions{ReadOnly: true}, true, "read committed"},
		{"pgx", dsn, &sql.TxOptions{Isolation: sql.LevelSerializable}, false, "serializable"},
		{"pgx", dsn + "&default_query_exec_mode=exec", nil, true, "read committed"},
		{"postgres", dsn, nil, true, "read committed"},
		{"postgres", dsn, &sql.TxOptions{Isolation: sql.LevelSerializable, ReadOnly: true}, true, "serializable"},
		{"postgres", dsn, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, true, "repeatable read"},
	} {
		db, err := Open(tc.driver, tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		info, xid := beginInfo(t, db, tc.opts)
		if info.Begun != tc.begun {
			t.Errorf("%s %+v: begun with the id: %v, want %v", tc.driver, tc.opts, info.Begun, tc.begun)
		}
		if tc.begun && (info.XID == "" || info.XID != xid) {
			t.Errorf("%s %+v: learnt transaction %q; the transaction has id %q", tc.driver, tc.opts, info.XID, xid)
		}
		ctx := context.WithValue(context.Background(), retry.InfoKey{}, &retry.CommitInfo{})
		tx, err := db.BeginTx(ctx, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		var level, readOnly string
		if err := tx.QueryRow("SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')").Scan(&level, &readOnly); err != nil {
			t.Fatal(err)
		}
		if want := tc.opts != nil && tc.opts.ReadOnly; level != tc.level || (readOnly == "on") != want {
			t.Errorf("%s %+v: transaction %s, read only %s", tc.driver, tc.opts, level, readOnly)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// A driver that prepares the text lockhooks sends as one BEGIN round trip
// (SQLSTATE 42601) makes it begin as usual from then on.
func TestRunInTxBeginFallsBackWhenTheDriverPrepares(t *testing.T) {
	db, err := Open("pgx", pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := stateOf(t, c)
	w.connector.own.Of(w.inner)
	w.connector.own.Args = []driver.NamedValue{} // pgx's default mode: it prepares
	c.Close()
	info, xid := beginInfo(t, db, nil)
	if info.Begun || xid != "" {
		t.Fatalf("begun %v, transaction id %q; want the driver's own BEGIN", info.Begun, xid)
	}
	if !w.connector.own.Disabled.Load() {
		t.Error("the failed BEGIN did not turn the combined BEGIN off")
	}
	if err := RunInTx(context.Background(), db, nil, func(tx *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// A server-side way to lose COMMIT's reply after the transaction committed:
// synchronous replication to a standby that does not exist. COMMIT writes
// the commit record, then waits for the standby; the backend is terminated
// in that wait ("the transaction has already committed locally"), so the
// client gets a FATAL error instead of COMMIT's reply. pg_xact_status says
// committed once the backend is gone: RunInTx reports success and does not
// run the transaction again. (Only a transaction that wrote WAL waits for
// a standby; the others are cut by the proxy above.) The setting is the
// cluster's: it is reset before the test ends.
func TestRunInTxCommitCutByTheServer(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	var super bool
	if err := raw.QueryRow("SELECT current_setting('is_superuser') = 'on'").Scan(&super); err != nil {
		t.Fatal(err)
	}
	if !super {
		t.Skip("SKIPPING: needs a superuser (ALTER SYSTEM) on the test server")
	}
	mustExec(t, raw, "CREATE TABLE orders (id SERIAL PRIMARY KEY, note TEXT NOT NULL)")
	mustExec(t, raw, "CREATE TABLE probe (id int)")
	// The test cluster runs with synchronous_commit = off, which never
	// waits for a standby: new connections to this database wait.
	mustExec(t, raw, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = on', current_database()); END $$")
	reset := func() {
		mustExec(t, raw, "ALTER SYSTEM RESET synchronous_standby_names")
		mustExec(t, raw, "SELECT pg_reload_conf()")
	}
	t.Cleanup(reset)
	mustExec(t, raw, "ALTER SYSTEM SET synchronous_standby_names = 'lockhooks_absent_standby'")
	mustExec(t, raw, "SELECT pg_reload_conf()")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// inSyncRepWait returns the backend of this database waiting for the
	// standby at COMMIT, 0 if none.
	inSyncRepWait := func() int32 {
		var pid int32
		err := raw.QueryRowContext(ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'SyncRep'`).Scan(&pid)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		return pid
	}
	// The setting reaches committing backends once the reload went round
	// (the checkpointer applies it): probe commits until one waits for the
	// standby, then release it (committed locally, it returns).
	var pid int32
	deadline := time.Now().Add(30 * time.Second)
	for waiting := false; !waiting; {
		if time.Now().After(deadline) {
			t.Fatal("no commit waited for the absent standby within 30s of the reload")
		}
		probe := make(chan error, 1)
		go func() {
			_, err := raw.ExecContext(ctx, "BEGIN; SET LOCAL synchronous_commit = on; INSERT INTO probe VALUES (1); COMMIT")
			probe <- err
		}()
		for polling := true; polling; {
			select {
			case err := <-probe: // committed without waiting: not applied yet
				if err != nil {
					t.Fatal(err)
				}
				polling = false
			default:
				if pid = inSyncRepWait(); pid != 0 {
					mustExec(t, raw, "SELECT pg_cancel_backend($1)", pid)
					if err := <-probe; err != nil {
						t.Fatal(err)
					}
					polling, waiting = false, true
				}
			}
		}
	}

	db, err := Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	attempts := 0
	var retried []error
	done := make(chan error, 1)
	go func() {
		done <- RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			attempts++
			_, err := tx.ExecContext(ctx, "INSERT INTO orders (note) VALUES ('once')")
			return err
		}, OnRetry(func(ev RetryEvent) { retried = append(retried, ev.Err) }))
	}()
	waitFor(t, 30*time.Second, "RunInTx's COMMIT to wait for the absent standby", func() bool { pid = inSyncRepWait(); return pid != 0 })
	var q string
	if err := raw.QueryRow("SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&q); err != nil || !strings.Contains(q, "COMMIT") {
		t.Fatalf("the backend waiting for the standby runs %q (%v), want RunInTx's COMMIT", q, err)
	}
	mustExec(t, raw, "SELECT pg_terminate_backend($1)", pid)
	if err := <-done; err != nil {
		t.Fatalf("RunInTx: %v", err)
	}
	reset()
	if n := countRows(t, raw, "orders"); attempts != 1 || len(retried) != 0 || n != 1 {
		t.Fatalf("%d attempts, retried %v, %d rows; want one attempt and one row", attempts, retried, n)
	}
}

// When lockhooks' BEGIN round trip fails after BEGIN ran (lib/pq runs the id
// query after BEGIN; here a role may not call pg_current_xact_id()), the
// transaction block is rolled back: the connection goes back to the pool
// clean, and RunInTx's error says what failed.
func TestRunInTxBeginFailureLeavesNoTransaction(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	role := "lockhooks_noxid_" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	mustExec(t, raw, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() { mustExec(t, raw, "DROP ROLE "+role) })
	mustExec(t, raw, "REVOKE EXECUTE ON FUNCTION pg_current_xact_id() FROM PUBLIC")
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	db, err := Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	err = RunInTx(context.Background(), db, nil, func(tx *sql.Tx) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "pg_current_xact_id") {
		t.Fatalf("RunInTx without the right to assign transaction ids: %v", err)
	}
	t.Log(err)
	var inBlock bool
	if err := db.QueryRow("SELECT now() <> statement_timestamp()").Scan(&inBlock); err != nil || inBlock {
		t.Fatalf("the pooled connection after the failed BEGIN: in a transaction block %v (%v)", inBlock, err)
	}
	if err := RunInTx(context.Background(), db, nil, func(tx *sql.Tx) error { return nil }, SkipCommitCheck()); err != nil {
		t.Fatalf("RunInTx with SkipCommitCheck: %v", err)
	}
}

// countingProxy relays TCP connections to a Postgres server and counts
// the round trips their clients start: the simple protocol's Query
// messages and the extended protocol's Syncs (each ends a batch the client
// then waits for).
type countingProxy struct {
	ln         net.Listener
	target     string
	roundTrips atomic.Int64
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			wg.Go(func() { io.Copy(client, server); client.Close() })
			wg.Go(func() { p.relay(server, client); server.Close() })
		}
	})
	return p
}

// relay copies the client's messages to the server, counting them.
func (p *countingProxy) relay(server io.Writer, client io.Reader) {
	r := bufio.NewReader(client)
	startup := true
	var header [5]byte
	for {
		var n int
		if startup { // the startup message has no type byte
			if _, err := io.ReadFull(r, header[1:]); err != nil {
				return
			}
			n = int(binary.BigEndian.Uint32(header[1:])) - 4
			startup = false
			if _, err := server.Write(header[1:]); err != nil {
				return
			}
		} else {
			if _, err := io.ReadFull(r, header[:]); err != nil {
				return
			}
			if header[0] == 'Q' || header[0] == 'S' {
				p.roundTrips.Add(1)
			}
			n = int(binary.BigEndian.Uint32(header[1:])) - 4
			if _, err := server.Write(header[:]); err != nil {
				return
			}
		}
		if _, err := io.CopyN(server, r, int64(n)); err != nil {
			return
		}
	}
}

// RunInTx with its defaults takes as many round trips as the hand-written
// transaction on the raw driver (BEGIN, the work, COMMIT), through pgx and
// lib/pq: what it needs to resolve a cut COMMIT travels with BEGIN (and,
// through lib/pq, with COMMIT). With an isolation level pgx cannot serve
// that way, one more.
func TestRunInTxRoundTrips(t *testing.T) {
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := newCountingProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	mustExec(t, openRaw(t, dsn), "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t VALUES (1, 0)")
	ctx := context.Background()
	work := func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", 1)
		return err
	}
	count := func(run func() error) int64 {
		t.Helper()
		for range 3 { // prepared statements cached, connections open
			if err := run(); err != nil {
				t.Fatal(err)
			}
		}
		before := p.roundTrips.Load()
		if err := run(); err != nil {
			t.Fatal(err)
		}
		return p.roundTrips.Load() - before
	}
	for _, driverName := range []string{"pgx", "postgres"} {
		raw, err := sql.Open(driverName, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raw.SetMaxOpenConns(1)
		db, err := Open(driverName, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		db.SetMaxOpenConns(1)
		manual := count(func() error { return manualTx(ctx, raw, work) })
		runInTx := count(func() error { return RunInTx(ctx, db, nil, work) })
		serializable := count(func() error {
			return RunInTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelSerializable}, work)
		})
		t.Logf("%s: round trips: manual on the raw driver %d, RunInTx %d, RunInTx SERIALIZABLE %d", driverName, manual, runInTx, serializable)
		if runInTx != manual {
			t.Errorf("%s: RunInTx took %d round trips, the hand-written transaction %d", driverName, runInTx, manual)
		}
		if want := manual + 1; driverName == "pgx" && serializable != want {
			t.Errorf("%s: RunInTx SERIALIZABLE took %d round trips, want %d (the id read before COMMIT)", driverName, serializable, want)
		}
	}
}

// Through each PgBouncer of the test matrix in transaction mode, RunInTx
// begins with the transaction id in BEGIN's round trip too (the simple
// protocol needs no prepared statement), and commits.
func TestRunInTxThroughPoolers(t *testing.T) {
	pgtest.EachPooler(t, func(t *testing.T, p *pgtest.Pooler) {
		e := newPoolerEnv(t, p)
		db := e.open(t, WithTransactionPooler())
		mustExec(t, e.raw, "CREATE TABLE orders (id SERIAL PRIMARY KEY, note TEXT NOT NULL)")
		info, xid := beginInfo(t, db, nil)
		if !info.Begun || info.XID == "" || info.XID != xid {
			t.Fatalf("begun %v with id %q; the transaction has id %q", info.Begun, info.XID, xid)
		}
		ctx := context.Background()
		for range 3 {
			if err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO orders (note) VALUES ($1)", "once")
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		if n := countRows(t, e.raw, "orders"); n != 3 {
			t.Fatalf("%d rows, want 3", n)
		}
	})
}

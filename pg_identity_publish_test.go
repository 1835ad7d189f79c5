package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// A transaction's BEGIN sets application_name to the transaction's
// identity for the transaction only: other sessions read who it is and
// where it began while it is open, and nothing is left once it ends.
func TestIdentityTransactionApplicationName(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw := openRaw(t, dsn)
	db := openDSN(t, dsn)
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := connPID(t, c)
	for _, end := range []string{"commit", "rollback"} {
		site := here(1)
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		app, _ := activity(t, raw, pid)
		id := identity.ParseAppName(app)
		if id == nil || id.Holds != "tx" || !siteMatches(id.Site, site) || id.Process != identity.ShortProcessLabel() || id.Conn == 0 {
			t.Errorf("in a transaction begun at %s, application_name = %q (%+v)", site, app, id)
		}
		if end == "commit" {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		if app, _ := activity(t, raw, pid); app != "" {
			t.Errorf("after %s, application_name = %q, want it empty again", end, app)
		}
	}
	// The user's own SET is kept, in transactions too.
	if _, err := c.ExecContext(ctx, "SET application_name = 'mine'"); err != nil {
		t.Fatal(err)
	}
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if app, _ := activity(t, raw, pid); app != "mine" {
		t.Errorf("in a transaction after SET application_name, application_name = %q, want mine", app)
	}
	tx.Rollback()
}

// A DSN that names the application is law: lockhooks never changes it.
func TestIdentityKeepsTheUsersApplicationName(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw := openRaw(t, dsn)
	db := openDSN(t, withDSNParam(t, dsn, "application_name", "billing"))
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := connPID(t, c)
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if app, _ := activity(t, raw, pid); app != "billing" {
		t.Errorf("in a transaction, application_name = %q, want billing", app)
	}
	tx.Rollback()
	site := here(1)
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(5)"); err != nil {
		t.Fatal(err)
	}
	app, query := activity(t, raw, pid)
	if app != "billing" {
		t.Errorf("holding a session lock, application_name = %q, want billing", app)
	}
	// The statement still names the holder.
	if id := identity.ParseAnnotation(query); id == nil || id.Site != site || id.Holds != "lock 5" {
		t.Errorf("holding a session lock, the last statement is %q, want lockhooks' annotated read naming %s", query, site)
	}
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_unlock(5)"); err != nil {
		t.Fatal(err)
	}
}

// A session lock's holder is named by the annotation on the statements
// that stay its last statement while it runs no other: on a connection to
// the server itself, the session-lock and unlock statements (through a
// pooler, the pg_locks read after them), a rerouted unlock (a parked
// holder), and COMMIT/ROLLBACK of a transaction lockhooks began.
// application_name is never set at session level (through a transaction
// pooler nobody declared it would outlive the session on a server
// connection that serves other clients).
func TestIdentitySessionLockAnnotation(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw := openRaw(t, dsn)
	tr := newTraced()
	db := tr.openPG(t, dsn)
	ctx, span := tr.parent("leader")
	defer span.End()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := connPID(t, c)
	before := time.Now()
	site := here(1)
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(42)"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(43)"); err != nil {
		t.Fatal(err)
	}
	c.Close() // parked, holding both
	app, query := activity(t, raw, pid)
	id := identity.Decode(app, query)
	if id == nil || id.Holds != "lock 42" || id.Site != site || id.Since.Before(before.Add(-time.Millisecond)) || id.Since.After(time.Now()) ||
		id.TraceID != span.SpanContext().TraceID().String() || id.SpanID == "" {
		t.Errorf("parked holder: application_name %q, statement %q: %+v; want lock 42 at %s in trace %s", app, query, id, site, span.SpanContext().TraceID())
	}
	if app != "" {
		t.Errorf("parked holder: application_name %q set at session level", app)
	}
	if !strings.HasPrefix(query, identity.AnnotationPrefix) {
		t.Errorf("the parked connection's last statement %q does not begin with the annotation", query)
	}
	// Unlocked through the pool (the unlock is rerouted to the parked
	// holder): the oldest first, after which the holder is named by the
	// lock that stays; the parked connection is closed once empty.
	if _, err := db.ExecContext(ctx, "SELECT pg_advisory_unlock(42)"); err != nil {
		t.Fatal(err)
	}
	if app, query := activity(t, raw, pid); identity.Decode(app, query) == nil || identity.Decode(app, query).Holds != "lock 43" {
		t.Errorf("parked holder after its oldest lock was unlocked: application_name %q, last statement %q; want lock 43 named", app, query)
	}
	if _, err := db.ExecContext(ctx, "SELECT pg_advisory_unlock(43)"); err != nil {
		t.Fatal(err)
	}

	// AcquireAdvisoryLock: its last statement is its lock statement, which
	// names it.
	site = here(1)
	l, err := AcquireAdvisoryLock(ctx, db, 44)
	if err != nil {
		t.Fatal(err)
	}
	lpid := connPID(t, l.Conn())
	app, query = activity(t, raw, lpid)
	if id := identity.Decode(app, query); app != "" || id == nil || id.Holds != "lock 44" || id.Site != site {
		t.Errorf("AcquireAdvisoryLock's holder: application_name %q, last statement %q; want it named by the annotation", app, query)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Taken and released on one connection, which goes back to the pool
	// with the user's own unlock last: it holds nothing, so nothing names
	// it.
	c2, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	pid2 := connPID(t, c2)
	unlock, err := AcquireAdvisoryLockOn(ctx, c2, 45)
	if err != nil {
		t.Fatal(err)
	}
	if app, query := activity(t, raw, pid2); app != "" || !strings.HasPrefix(query, identity.AnnotationPrefix) {
		t.Errorf("holding: application_name %q, last statement %q", app, query)
	}
	unlock()
	if app, query := activity(t, raw, pid2); app != "" || query != "SELECT pg_advisory_unlock($1)" {
		t.Errorf("after the unlock: application_name %q, last statement %q; want it empty, and the unlock as written", app, query)
	}
}

// AcquireAdvisoryLockOn takes session lock key on c and returns its unlock.
func AcquireAdvisoryLockOn(ctx context.Context, c *sql.Conn, key int64) (func(), error) {
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return nil, err
	}
	return func() { c.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key) }, nil
}

// lockhooks' own BEGIN honours the options, and its COMMIT never reports
// success for a transaction Postgres rolled back.
func TestIdentityBeginCommit(t *testing.T) {
	dsn := pgtest.DSN(t)
	db := openDSN(t, dsn)
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE t (id int PRIMARY KEY, v int)")
	for _, tc := range []struct {
		opts     *sql.TxOptions
		iso, ro  string
		identity bool
	}{
		{nil, "read committed", "off", true},
		{&sql.TxOptions{Isolation: sql.LevelRepeatableRead}, "repeatable read", "off", true},
		{&sql.TxOptions{Isolation: sql.LevelSnapshot}, "repeatable read", "off", true},
		{&sql.TxOptions{Isolation: sql.LevelSerializable, ReadOnly: true}, "serializable", "on", true},
		{&sql.TxOptions{Isolation: sql.LevelReadUncommitted}, "read uncommitted", "off", true},
		{&sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true}, "read committed", "on", true},
	} {
		tx, err := db.BeginTx(ctx, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		var iso, ro, app string
		if err := tx.QueryRow("SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only'), current_setting('application_name')").Scan(&iso, &ro, &app); err != nil {
			t.Fatal(err)
		}
		if iso != tc.iso || ro != tc.ro || strings.HasPrefix(app, identity.AppNamePrefix) != tc.identity {
			t.Errorf("%+v: isolation %s, read only %s, application_name %q", tc.opts, iso, ro, app)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelLinearizable}); err == nil {
		t.Error("LevelLinearizable began; pgx refuses it")
	}

	// An aborted transaction: COMMIT fails, nothing is committed, and the
	// connection is usable.
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO t VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("SELECT 1/0"); err == nil {
		t.Fatal("1/0 worked")
	}
	err = tx.Commit()
	if err == nil || !strings.Contains(err.Error(), "rolled back") || dberr.SQLState(err) != "25P02" {
		t.Errorf("COMMIT of an aborted transaction: %v", err)
	}
	var n int
	if err := c.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 0 {
		t.Errorf("after the failed COMMIT: count %d, %v; want 0 and a usable connection", n, err)
	}
	// A failing COMMIT (deferred constraint) reports the server's error.
	mustExec(t, db, "CREATE TABLE u (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)")
	tx, err = c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO u VALUES (1), (1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); dberr.SQLState(err) != "23505" {
		t.Errorf("COMMIT with a deferred duplicate: %v, want 23505", err)
	}
	// A cancelled context rolls the transaction back (database/sql), and the
	// connection survives it.
	cctx, cancel := context.WithCancel(ctx)
	tx, err = c.BeginTx(cctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO t VALUES (2, 2)"); err != nil {
		t.Fatal(err)
	}
	cpid := connPID(t, c)
	cancel()
	if err := tx.Commit(); !errors.Is(err, context.Canceled) && !errors.Is(err, sql.ErrTxDone) {
		t.Errorf("Commit after cancel: %v", err)
	}
	// database/sql rolls back in the background.
	waitFor(t, 10*time.Second, "the cancelled transaction to end", func() bool {
		var open bool
		if err := db.QueryRow("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND xact_start IS NOT NULL)", cpid).Scan(&open); err != nil {
			t.Fatal(err)
		}
		return !open
	})
	if err := db.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != 0 {
		t.Errorf("after the cancelled transaction: count %d, %v", n, err)
	}
	// RunInTx commits through it.
	if err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		_, err := tx.Exec("INSERT INTO t VALUES (3, 3)")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Errorf("after RunInTx: %d rows, %v", n, err)
	}
}

// An advisory chain in one server: the holder is a session of another
// application, another session waits for the key too, then lockhooks'
// connection. The slow-wait line names the holder first and the other
// waiter as queued, though pg_blocking_pids names both as blocking.
func TestBlockersRootHolderAndQueue(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw := openRaw(t, withDSNParam(t, dsn, "application_name", "other-app"))
	ctx := context.Background()
	holder, hpid := rawBlocker(t, raw, 4242, "x")
	defer holder.Close()
	queued, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go queued.ExecContext(qctx, "SELECT pg_advisory_lock(4242) /* queued */")
	var qpid int32
	waitFor(t, 20*time.Second, "the queued session to wait", func() bool {
		return raw.QueryRow("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%queued%'").Scan(&qpid) == nil
	})
	buf := &syncBuffer{}
	db := openDSN(t, dsn, slowLogOptions(buf, 200*time.Millisecond)...)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = AcquireAdvisoryLock(wctx, db, 4242)
	wcancel()
	if err == nil {
		t.Fatal("took a held lock")
	}
	line := ""
	waitFor(t, 10*time.Second, "the slow-wait line", func() bool {
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.Contains(l, "still waiting") {
				line = l
			}
		}
		return line != ""
	})
	h, q := "backend pid "+strconv.Itoa(int(hpid)), "backend pid "+strconv.Itoa(int(qpid))
	if !strings.Contains(line, "holder_pid="+strconv.Itoa(int(hpid))) || !strings.Contains(line, "queued_pids="+strconv.Itoa(int(qpid))) ||
		!strings.Contains(line, "queued ahead") || strings.Index(line, h) < 0 || strings.Index(line, h) > strings.Index(line, q) {
		t.Errorf("the slow-wait line does not name %s as the holder and %s as queued:\n%s", h, q, line)
	}
	if !strings.Contains(err.Error(), h) {
		t.Errorf("the error does not name the holder: %v", err)
	}
	if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
}

// A session lock taken inside a transaction outlives it: the transaction's
// COMMIT or ROLLBACK (lockhooks' own, as it began the transaction) carries
// the holder's annotation, so the lock is still named once the transaction
// is over, whether it committed or rolled back, through pgx and lib/pq; its
// unlock leaves nothing behind. A savepoint rolled back around the lock or
// the unlock changes nothing: session locks ignore it, and nothing lockhooks
// publishes is undone by it.
func TestIdentitySessionLockOutlivesItsTransaction(t *testing.T) {
	dsn := pgtest.DSN(t)
	raw := openRaw(t, dsn)
	for _, driverName := range []string{"pgx", "postgres"} {
		t.Run(driverName, func(t *testing.T) {
			db, err := Open(driverName, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			sessionLockOutlivesItsTransaction(t, raw, db)
		})
	}
}

func sessionLockOutlivesItsTransaction(t *testing.T, raw, db *sql.DB) {
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := connPID(t, c)
	named := func(what, site string) {
		t.Helper()
		app, query := activity(t, raw, pid)
		if id := identity.Decode(app, query); app != "" || id == nil || id.Holds != "lock 61" || !siteMatches(id.Site, site) {
			t.Errorf("%s: application_name %q, last statement %q; want the session lock taken at %s named by the annotation", what, app, query, site)
		}
	}
	unlocked := func(what string) {
		t.Helper()
		if app, query := activity(t, raw, pid); app != "" || identity.Decode(app, query) != nil {
			t.Errorf("%s: after the unlock, application_name %q, last statement %q", what, app, query)
		}
	}
	for _, end := range []string{"rollback", "commit"} {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		site := here(1)
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_lock(61)"); err != nil {
			t.Fatal(err)
		}
		if end == "rollback" {
			err = tx.Rollback()
		} else {
			err = tx.Commit()
		}
		if err != nil {
			t.Fatal(err)
		}
		named("database/sql transaction, "+end, site)
		mustExec(t, c, "SELECT pg_advisory_unlock(61)")
		unlocked("database/sql transaction, " + end)
	}

	// An unlock inside a savepoint that is rolled back: the key is free
	// (session locks ignore savepoints), and nothing names it.
	site := here(1)
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock(61)"); err != nil {
		t.Fatal(err)
	}
	named("before the savepoint", site)
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"SAVEPOINT a", "SELECT pg_advisory_unlock(61)", "ROLLBACK TO SAVEPOINT a"} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	unlocked("unlock in a rolled-back savepoint")

	// A lock inside a savepoint that is rolled back: still held, and named.
	tx, err = c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, "SAVEPOINT b")
	site = here(1)
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_lock(61)"); err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, "ROLLBACK TO SAVEPOINT b")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	named("lock in a rolled-back savepoint", site)
	var n int
	if err := raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1 AND objid = 61", pid).Scan(&n); err != nil || n != 1 {
		t.Fatalf("key 61 after the savepoint's rollback: %d rows, %v; want it held", n, err)
	}
	mustExec(t, c, "SELECT pg_advisory_unlock(61)")
	unlocked("lock in a rolled-back savepoint")
}

// sql.LevelSnapshot through lockhooks' own BEGIN is what the driver makes
// of it: pgx begins it at REPEATABLE READ, lib/pq refuses it.
func TestSnapshotLevelAsTheDriverHasIt(t *testing.T) {
	dsn := pgtest.DSN(t)
	ctx := context.Background()
	snapshot := &sql.TxOptions{Isolation: sql.LevelSnapshot}
	for _, name := range []string{"pgx", "postgres"} {
		t.Run(name, func(t *testing.T) {
			db, err := Open(name, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var level string
			err = RunInTx(ctx, db, snapshot, func(tx *sql.Tx) error {
				return tx.QueryRowContext(ctx, "SHOW transaction_isolation").Scan(&level)
			})
			rawTx, rawErr := db.BeginTx(ctx, snapshot)
			if rawErr == nil {
				rawTx.Rollback()
			}
			switch name {
			case "pgx":
				if err != nil || level != "repeatable read" {
					t.Errorf("RunInTx at LevelSnapshot through pgx: %v, level %q; want repeatable read", err, level)
				}
			case "postgres":
				// lockhooks begins these itself (its BEGIN carries the
				// identity, and RunInTx's id): it must refuse what lib/pq's
				// BeginTx refuses.
				if rawErr == nil {
					t.Error("db.BeginTx at LevelSnapshot through lib/pq began a transaction; lib/pq refuses that level")
				}
				if err == nil {
					t.Errorf("RunInTx at LevelSnapshot through lib/pq ran (at %q); lib/pq refuses that level", level)
				}
			}
		})
	}
}

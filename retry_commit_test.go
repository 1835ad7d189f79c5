package lockhooks

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// cutOffCommit runs one RunInTx that inserts a row into a table whose
// deferred constraint trigger, at COMMIT, waits for an advisory lock the
// test holds; the test finds that backend waiting in pg_locks and
// terminates it, so the first COMMIT is cut off in flight. It returns
// RunInTx's error, how many attempts ran, the errors retried and how many
// rows landed.
func cutOffCommit(t *testing.T, options ...RetryOption) (err error, attempts int, retried []error, rows int) {
	t.Helper()
	dsn := pgtest.DSN(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, q := range []string{
		"CREATE TABLE orders (id SERIAL PRIMARY KEY, note TEXT NOT NULL)",
		`CREATE FUNCTION wait_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN PERFORM pg_advisory_xact_lock(777); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER wait_at_commit AFTER INSERT ON orders
		 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION wait_at_commit()`,
	} {
		mustExec(t, raw, q)
	}
	holder, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	mustExec(t, holder, "SELECT pg_advisory_lock(777)")

	db, err := Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	done := make(chan error, 1)
	options = append(options, OnRetry(func(e RetryEvent) { retried = append(retried, e.Err) }))
	go func() {
		done <- RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			attempts++
			_, err := tx.ExecContext(ctx, "INSERT INTO orders (note) VALUES ('once')")
			return err
		}, options...)
	}()

	// The first attempt's COMMIT runs the trigger, which waits for 777.
	var pid int
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := raw.QueryRowContext(ctx, `SELECT pid FROM pg_locks
			WHERE locktype = 'advisory' AND objid = 777 AND NOT granted`).Scan(&pid)
		if err == nil {
			break
		}
		if !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the COMMIT never reached the trigger's lock wait")
		}
		select {
		case err := <-done:
			t.Fatalf("RunInTx returned before its COMMIT was cut off: %v", err)
		case <-time.After(5 * time.Millisecond): // polling pg_locks, not timing
		}
	}
	var ok bool
	if err := raw.QueryRowContext(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
	mustExec(t, holder, "SELECT pg_advisory_unlock(777)")
	err = <-done
	if qerr := raw.QueryRow("SELECT count(*) FROM orders WHERE note = 'once'").Scan(&rows); qerr != nil {
		t.Fatal(qerr)
	}
	return err, attempts, retried, rows
}

// TestRunInTxResolvesCutOffCommit: the backend dies while COMMIT is in
// flight; pg_xact_status on another connection says the transaction
// aborted, so RunInTx runs it again and the row lands exactly once.
func TestRunInTxResolvesCutOffCommit(t *testing.T) {
	err, attempts, retried, rows := cutOffCommit(t)
	if err != nil {
		t.Fatalf("RunInTx: %v", err)
	}
	if attempts != 2 || len(retried) != 1 || rows != 1 {
		t.Fatalf("%d attempts, retried %v, %d rows; want 2 attempts, one retry, one row", attempts, retried, rows)
	}
	if msg := retried[0].Error(); !strings.Contains(msg, "pg_xact_status says it aborted") || !strings.Contains(msg, "57P01") {
		t.Errorf("the retried error does not say how the commit was resolved: %s", msg)
	}
	t.Logf("retried after: %v", retried[0])
}

// TestRunInTxAmbiguousWithoutCommitCheck: with SkipCommitCheck the same
// cut-off COMMIT cannot be resolved, and RunInTx says so instead of
// retrying blindly.
func TestRunInTxAmbiguousWithoutCommitCheck(t *testing.T) {
	err, attempts, retried, rows := cutOffCommit(t, SkipCommitCheck())
	if !errors.Is(err, ErrAmbiguousCommit) || attempts != 1 || len(retried) != 0 {
		t.Fatalf("err %v after %d attempts (retried %v); want ErrAmbiguousCommit after one", err, attempts, retried)
	}
	if rows != 0 {
		t.Errorf("%d rows; the terminated transaction aborted", rows)
	}
	t.Log(err)
}

// cuttingProxy is a fault proxy in front of a Postgres server that, once
// armed, cuts the first connection whose client sends COMMIT: the COMMIT
// reaches the server, which commits and answers, and then the client's
// connection breaks; the answer never reaches the client.
// With drop set, the COMMIT is lost instead of forwarded, and the server's
// side stays open: the backend waits, idle in the transaction, for a
// COMMIT that never comes (a black-holed network). The database is real;
// only the network fails. The client's side is cut with a reset
// (faultproxy.Link.CutClient), so the driver sees ECONNRESET; between the
// COMMIT and the cut it sends nothing more (it waits for COMMIT's answer).
type cuttingProxy struct {
	armed atomic.Bool
	drop  atomic.Bool
	cut   atomic.Bool // a COMMIT was cut
}

// newCuttingProxy starts a cutting proxy in front of dsn's server and
// returns dsn through it.
func newCuttingProxy(t *testing.T, dsn string) (*cuttingProxy, string) {
	t.Helper()
	proxied, proxy := throughFaultProxy(t, dsn)
	p := &cuttingProxy{}
	proxy.OnAccept(p.watch)
	return p, proxied
}

// watch watches one link for the COMMIT to cut.
func (p *cuttingProxy) watch(l *faultproxy.Link) {
	// From the cut on, the server's bytes are swallowed: the first of them
	// is COMMIT's answer, which closes replied.
	var swallow atomic.Bool
	replied := make(chan struct{})
	var once sync.Once
	l.Watch(faultproxy.ToClient, func([]byte) bool {
		if swallow.Load() {
			once.Do(func() { close(replied) })
			return false
		}
		return true
	})
	l.Watch(faultproxy.ToServer, func(chunk []byte) bool {
		if !p.armed.Load() || !bytes.Contains(bytes.ToLower(chunk), []byte("commit\x00")) || !p.cut.CompareAndSwap(false, true) {
			return true
		}
		if p.drop.Load() {
			l.CutClient()
			return false
		}
		// The server commits and answers before the client's connection
		// breaks, so the outcome is decided when RunInTx asks; the answer
		// never reaches the client.
		swallow.Store(true)
		go func() {
			select {
			case <-replied:
			case <-l.Done():
			case <-time.After(30 * time.Second):
			}
			l.CutClient()
		}()
		return true
	})
}

// TestRunInTxResolvesCommittedCommit: the connection breaks after COMMIT
// reached the server; pg_xact_status says committed, so RunInTx reports
// success and does not run the transaction again.
func TestRunInTxResolvesCommittedCommit(t *testing.T) {
	proxy, proxied := newCuttingProxy(t, pgtest.DSN(t))
	db, err := Open("pgx", withDSNParam(t, proxied, "sslmode", "disable"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, "CREATE TABLE orders (id SERIAL PRIMARY KEY, note TEXT NOT NULL)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	attempts := 0
	var retried []error
	proxy.armed.Store(true)
	err = RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		attempts++
		_, err := tx.ExecContext(ctx, "INSERT INTO orders (note) VALUES ('once')")
		return err
	}, OnRetry(func(e RetryEvent) { retried = append(retried, e.Err) }))
	if err != nil {
		t.Fatalf("RunInTx: %v", err)
	}
	if !proxy.cut.Load() {
		t.Fatal("the proxy never cut a COMMIT")
	}
	if n := countRows(t, db, "orders"); attempts != 1 || len(retried) != 0 || n != 1 {
		t.Fatalf("%d attempts, retried %v, %d rows; want one attempt and one row", attempts, retried, n)
	}
}

package pgbegin

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/retry"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// serverConn is a real pgx connection as lockhooks runs its own
// statements on it.
type serverConn struct {
	inner driver.Conn
	note  string
}

// ExecOwn runs q as the root does: an Exec without arguments, which pgx
// sends in the simple protocol (so a text of several statements runs).
func (c *serverConn) ExecOwn(ctx context.Context, q string) error {
	_, err := c.inner.(driver.ExecerContext).ExecContext(ctx, q, nil)
	return err
}
func (c *serverConn) OwnNote() string { return c.note }

// Against a real server: a message with the id begins the transaction and
// reads its id; COMMIT commits it, led by the holder's note; a
// transaction a failed statement aborted is rolled back and reported as
// 25P02, read from pgx's status or found by the guarded COMMIT; ROLLBACK
// rolls back. The connection is never left in a transaction.
func TestCommitAgainstTheServer(t *testing.T) {
	dsn := pgtest.DSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.ExecContext(ctx, "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	inner, err := stdlib.GetDefaultDriver().Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	c := &serverConn{inner: inner, note: "/*lockhooks holder: test*/ "}
	own := new(pgdriver.Statements).Of(inner)
	status := pgdriver.TxStatus(inner)
	if status == nil || !own.OK() {
		t.Fatal("pgx's transaction status or simple protocol not found")
	}
	pid, ok := pgdriver.BackendKeyPID(inner) // (a direct connection: its backend's own pid)
	if !ok {
		t.Fatal("no backend pid")
	}
	state := func() (string, string) {
		var st, q string
		if err := raw.QueryRowContext(ctx, "SELECT state, query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&st, &q); err != nil {
			t.Fatal(err)
		}
		return st, q
	}
	count := func() (n int) {
		raw.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n)
		return n
	}

	var m Message
	m.Compose("", driver.TxOptions{}, true, false, Clause(driver.TxOptions{}, true), own.IDFirst, "")
	var info retry.CommitInfo
	var row [1]driver.Value
	if err := ReadID(ctx, c, inner.(driver.QueryerContext), &m, own.Args, row[:], &info); err != nil || info.XID == "" || row[0] != nil {
		t.Fatalf("BEGIN with the id: %v, xid %q, row left %v", err, info.XID, row[0])
	}
	if st, _ := state(); st != "idle in transaction" {
		t.Fatalf("after BEGIN: %s", st)
	}
	if err := c.ExecOwn(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := Commit(ctx, c, status); err != nil {
		t.Fatal(err)
	}
	if st, q := state(); st != "idle" || q != c.note+"COMMIT" || count() != 1 {
		t.Errorf("after COMMIT: %s, %q, %d rows", st, q, count())
	}

	for _, how := range []struct {
		name   string
		status pgdriver.TxStatuser
	}{{"pgx's status", status}, {"the guarded COMMIT", nil}} {
		if err := c.ExecOwn(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		c.ExecOwn(ctx, "INSERT INTO t VALUES (2)")
		if err := c.ExecOwn(ctx, "INSERT INTO t VALUES (1)"); dberr.SQLState(err) != "23505" {
			t.Fatalf("%s: the duplicate: %v", how.name, err)
		}
		err := Commit(ctx, c, how.status)
		if dberr.SQLState(err) != "25P02" || !strings.Contains(err.Error(), "rolled back instead of committed") {
			t.Errorf("%s: commit of an aborted transaction: %v", how.name, err)
		}
		if how.status != nil && !errors.Is(err, ErrTxAborted) {
			t.Errorf("%s: %v is not ErrTxAborted", how.name, err)
		}
		if st, _ := state(); st != "idle" || count() != 1 {
			t.Errorf("%s: after the failed commit: %s, %d rows", how.name, st, count())
		}
	}

	if err := c.ExecOwn(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	c.ExecOwn(ctx, "INSERT INTO t VALUES (3)")
	if err := Rollback(c); err != nil {
		t.Fatal(err)
	}
	if st, q := state(); st != "idle" || q != c.note+"ROLLBACK" || count() != 1 {
		t.Errorf("after ROLLBACK: %s, %q, %d rows", st, q, count())
	}
}

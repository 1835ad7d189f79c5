package pgbegin

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// The levels are database/sql's, in its numbering; each becomes its
// clause, a level Postgres lacks none (the driver's BeginTx decides).
func TestClause(t *testing.T) {
	level := func(l sql.IsolationLevel) driver.IsolationLevel { return driver.IsolationLevel(l) }
	cases := []struct {
		opts     driver.TxOptions
		snapshot bool
		want     string
	}{
		{driver.TxOptions{}, false, "BEGIN"},
		{driver.TxOptions{ReadOnly: true}, false, "BEGIN READ ONLY"},
		{driver.TxOptions{Isolation: level(sql.LevelReadUncommitted)}, false, "BEGIN ISOLATION LEVEL READ UNCOMMITTED"},
		{driver.TxOptions{Isolation: level(sql.LevelReadCommitted)}, false, "BEGIN ISOLATION LEVEL READ COMMITTED"},
		{driver.TxOptions{Isolation: level(sql.LevelWriteCommitted)}, false, ""},
		{driver.TxOptions{Isolation: level(sql.LevelRepeatableRead), ReadOnly: true}, false, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"},
		{driver.TxOptions{Isolation: level(sql.LevelSnapshot)}, false, ""},
		{driver.TxOptions{Isolation: level(sql.LevelSnapshot)}, true, "BEGIN ISOLATION LEVEL REPEATABLE READ"},
		{driver.TxOptions{Isolation: level(sql.LevelSerializable)}, false, "BEGIN ISOLATION LEVEL SERIALIZABLE"},
		{driver.TxOptions{Isolation: level(sql.LevelLinearizable)}, false, ""},
	}
	for _, c := range cases {
		if got := Clause(c.opts, c.snapshot); got != c.want {
			t.Errorf("Clause(%+v, %v) = %q, want %q", c.opts, c.snapshot, got, c.want)
		}
	}
	if !DefaultLevel(driver.TxOptions{ReadOnly: true}) || DefaultLevel(driver.TxOptions{Isolation: level(sql.LevelSerializable)}) {
		t.Error("DefaultLevel")
	}
}

// A message is composed of what the transaction needs, in the order its
// driver reads rows in, and reused while transactions begin alike.
func TestMessageComposeAndReuse(t *testing.T) {
	var m Message
	opts := driver.TxOptions{}
	if m.Reusable("", opts, false, false) {
		t.Fatal("an empty message is reusable")
	}
	m.Compose("app.go:7", opts, true, true, "BEGIN", true, "lockhooks x")
	if !strings.HasPrefix(m.Text, "SELECT (CASE WHEN pg_is_in_recovery()") || !strings.HasSuffix(m.Text, ") AS lockhooks_identity; BEGIN") || m.Cols != 1 {
		t.Errorf("pgx, id and identity: %q (%d columns)", m.Text, m.Cols)
	}
	if !m.Reusable("app.go:7", opts, true, true) || m.Reusable("app.go:8", opts, true, true) || m.Reusable("app.go:7", driver.TxOptions{ReadOnly: true}, true, true) || m.Reusable("app.go:7", opts, false, true) {
		t.Error("Reusable: only for the same site, options, id and identity")
	}
	m.Compose("app.go:7", opts, true, false, "BEGIN", false, "")
	if !strings.HasPrefix(m.Text, "BEGIN; SELECT (CASE") || strings.Contains(m.Text, "application_name") || m.Cols != 1 {
		t.Errorf("lib/pq, id only: %q", m.Text)
	}
	m.Compose("app.go:7", opts, false, true, "BEGIN READ ONLY", true, "lockhooks x")
	if !strings.HasPrefix(m.Text, "BEGIN READ ONLY; SELECT set_config('application_name'") || m.Cols != 0 {
		t.Errorf("identity only: %q (%d columns)", m.Text, m.Cols)
	}
}

// sqlError is a server's error with a SQLSTATE.
type sqlError string

func (e sqlError) Error() string    { return "ERROR: " + string(e) }
func (e sqlError) SQLState() string { return string(e) }

// own records what ran of lockhooks' own.
type own struct {
	ran  []string
	note string
	fail error
}

func (o *own) ExecOwn(_ context.Context, q string) error { o.ran = append(o.ran, q); return o.fail }
func (o *own) OwnNote() string                           { return o.note }

// A message refused as a message disables lockhooks' BEGIN; a server's
// error is rolled back; another error is left to the caller.
func TestAfterFailure(t *testing.T) {
	var st pgdriver.Statements
	var c own
	if !AfterFailure(&c, &st, sqlError("42601")) || !st.Disabled.Load() || strings.Join(c.ran, ";") != "ROLLBACK" {
		t.Errorf("42601: disabled %v, ran %q", st.Disabled.Load(), c.ran)
	}
	st.Disabled.Store(false)
	c.ran = nil
	if AfterFailure(&c, &st, sqlError("40001")) || st.Disabled.Load() || strings.Join(c.ran, ";") != "ROLLBACK" {
		t.Errorf("40001: disabled %v, ran %q", st.Disabled.Load(), c.ran)
	}
	c.ran = nil
	if !AfterFailure(&c, &st, errors.New("pgx: cannot use simple protocol here")) || len(c.ran) != 0 {
		t.Errorf("a refused simple protocol: ran %q", c.ran)
	}
}

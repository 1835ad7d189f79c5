package pgbegin

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"strings"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/retry"
)

// The isolation levels of database/sql (sql.IsolationLevel), as a driver
// receives them in driver.TxOptions; named here because the core does not
// import database/sql.
const (
	levelDefault driver.IsolationLevel = iota
	levelReadUncommitted
	levelReadCommitted
	levelWriteCommitted
	levelRepeatableRead
	levelSnapshot
	levelSerializable
	levelLinearizable
)

// Clause is BEGIN with opts, or "" for a level Postgres does not have (the
// driver's BeginTx says what it makes of it). snapshot says that the
// driver begins sql.LevelSnapshot at REPEATABLE READ (pgx does; lib/pq
// refuses it, and lockhooks' BEGIN must not accept what the driver's
// refuses).
func Clause(opts driver.TxOptions, snapshot bool) string {
	begin := "BEGIN"
	switch opts.Isolation {
	case levelDefault:
	case levelReadUncommitted:
		begin += " ISOLATION LEVEL READ UNCOMMITTED"
	case levelReadCommitted:
		begin += " ISOLATION LEVEL READ COMMITTED"
	case levelRepeatableRead:
		begin += " ISOLATION LEVEL REPEATABLE READ"
	case levelSnapshot:
		if !snapshot {
			return ""
		}
		begin += " ISOLATION LEVEL REPEATABLE READ"
	case levelSerializable:
		begin += " ISOLATION LEVEL SERIALIZABLE"
	default:
		return ""
	}
	if opts.ReadOnly {
		begin += " READ ONLY"
	}
	return begin
}

// DefaultLevel reports whether opts leave the isolation level to the
// server (sql.LevelDefault).
func DefaultLevel(opts driver.TxOptions) bool { return opts.Isolation == levelDefault }

// Message is a connection's last composed BEGIN message, reused while its
// transactions begin alike (one code path's, at one call site), so that a
// repeated transaction composes nothing.
type Message struct {
	site    string // where the transaction began, as its identity names it ("" when it publishes none)
	opts    driver.TxOptions
	id      bool // it queries RunInTx's transaction id
	publish bool // it sets the identity

	Text string // the message
	Cols int    // the columns of the row it returns (0: none; 1: the id)
}

// Reusable reports whether m is the message of a transaction begun at
// site with opts that queries its id (id) and sets its identity
// (publish).
func (m *Message) Reusable(site string, opts driver.TxOptions, id, publish bool) bool {
	return m.Text != "" && m.site == site && m.opts == opts && m.id == id && m.publish == publish
}

// Compose makes m the message of such a transaction: begin is its
// Clause, idFirst says that the driver returns only the first statement's
// rows (pgx), appName is the identity it sets when publish. The id query
// sets the identity in its FROM clause, so that its row has one column
// (each column costs the driver allocations to read).
func (m *Message) Compose(site string, opts driver.TxOptions, id, publish bool, begin string, idFirst bool, appName string) {
	*m = Message{site: site, opts: opts, id: id, publish: publish}
	var query string
	switch {
	case id && publish:
		query = retry.XIDQuery + " FROM (SELECT " + identity.SetAppName(appName, true, 0) + ") AS lockhooks_identity"
	case id:
		query = retry.XIDQuery
	default:
		query = "SELECT " + identity.SetAppName(appName, true, 0)
	}
	if id {
		m.Cols = 1
	}
	if id && idFirst {
		m.Text = query + "; " + begin
	} else {
		m.Text = begin + "; " + query
	}
}

// Conn is the connection lockhooks begins and ends its own transactions
// on, as the caller runs its own statements there.
type Conn interface {
	// ExecOwn runs query on the connection, bypassing the statement hooks.
	ExecOwn(ctx context.Context, query string) error
	// OwnNote is the annotation that leads lockhooks' COMMIT and ROLLBACK
	// (naming the holder of the connection's session locks), "" for none.
	OwnNote() string
}

// ReadID runs m, a message that returns RunInTx's transaction id (its
// row's first column), with q, into info; row is the caller's buffer of
// at least m.Cols values, cleared after. A failure other than the
// server's may leave the transaction begun: it is rolled back on c (a
// server error is the caller's, AfterFailure).
func ReadID(ctx context.Context, c Conn, q driver.QueryerContext, m *Message, args []driver.NamedValue, row []driver.Value, info *retry.CommitInfo) error {
	rows, err := q.QueryContext(ctx, m.Text, args)
	if err != nil {
		return err
	}
	row = row[:m.Cols]
	err = rows.Next(row)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err == io.EOF {
		err = fmt.Errorf("lockhooks: %q returned no row", m.Text)
	}
	info.SetXID(row[0])
	clear(row)
	if err != nil && !dberr.FromServer(err) {
		// The transaction may have begun: end it, whatever state it is in
		// (a server error is rolled back by the caller).
		c.ExecOwn(context.Background(), "ROLLBACK")
	}
	return err
}

// AfterFailure is what follows a BEGIN message that failed with err. BEGIN
// may have run before the statement that failed (lib/pq's order, or the
// identity after BEGIN): on a server's error no transaction block is left
// behind. It reports whether the driver begins every transaction from now
// on: it prepared the text instead of sending it as it is ("cannot insert
// multiple commands into a prepared statement", 42601), or refused the
// simple protocol (pgx does without standard_conforming_strings), and
// nothing ran (own is disabled).
func AfterFailure(c Conn, own *pgdriver.Statements, err error) (driverBegins bool) {
	if dberr.FromServer(err) {
		c.ExecOwn(context.Background(), "ROLLBACK")
	}
	if dberr.SQLState(err) == "42601" || strings.Contains(err.Error(), "simple protocol") {
		own.Disabled.Store(true)
		return true
	}
	return false
}

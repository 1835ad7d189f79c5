package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"strings"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/retry"
)

// lockhooks' own BEGIN and COMMIT on Postgres.
//
// A transaction has two things to say in BEGIN's round trip: RunInTx's
// transaction id, which a cut-off COMMIT is resolved by (internal/retry),
// and its identity for waiters in other processes, a transaction-local
// application_name naming where it began (internal/identity). Where either is
// wanted and the driver allows it, lockhooks sends the BEGIN itself, in one
// simple-protocol message composed of what the transaction needs, and ends
// the transaction with its own COMMIT and ROLLBACK (pgTx):
//
//	pgx, RunInTx:    SELECT <id> FROM (SELECT set_config('application_name', …, true)) …; BEGIN [READ ONLY]
//	lib/pq, RunInTx: BEGIN [ISOLATION LEVEL …] [READ ONLY]; SELECT <id> FROM (SELECT set_config(…)) …
//	any other:       BEGIN [ISOLATION LEVEL …] [READ ONLY]; SELECT set_config(…)
//
// pgx returns only the first statement's rows, so its id is queried before
// BEGIN: statements before BEGIN in one message form an implicit
// transaction that BEGIN turns into the transaction block, keeping its id
// and its transaction-local settings, but a query there fixes the
// isolation level, so through pgx only transactions at the default level
// learn their id at BEGIN (the others read it before COMMIT, in a round
// trip of their own). lib/pq returns the rows of the text's first statement
// that has some. A connection that publishes no identity (its
// application_name is the user's) and a transaction that is not RunInTx's
// begin as the driver begins them; so do all transactions of a driver that
// cannot run such a message (neither pgx's stdlib nor lib/pq) and of one
// that turned out not to (it prepared the text, SQLSTATE 42601).
//
// The simple protocol through database/sql, without naming the driver's
// types (the root package imports no driver; internal/pgdriver finds what
// each allows): lib/pq runs every query
// without arguments that way; pgx's stdlib runs a query that way when its
// first argument is pgx's QueryExecModeSimpleProtocol (a value found by
// reflection, once per database), and an Exec without arguments always.
// The simple protocol also keeps texts that change with every hold (the
// identities) out of pgx's statement cache.

// beginClause is BEGIN with opts, or "" for a level Postgres does not
// have (the driver's BeginTx says what it makes of it). snapshot says that
// the driver begins sql.LevelSnapshot at REPEATABLE READ (pgx does; lib/pq
// refuses it, and lockhooks' BEGIN must not accept what the driver's
// refuses).
func beginClause(opts driver.TxOptions, snapshot bool) string {
	begin := "BEGIN"
	switch sql.IsolationLevel(opts.Isolation) {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		begin += " ISOLATION LEVEL READ UNCOMMITTED"
	case sql.LevelReadCommitted:
		begin += " ISOLATION LEVEL READ COMMITTED"
	case sql.LevelRepeatableRead:
		begin += " ISOLATION LEVEL REPEATABLE READ"
	case sql.LevelSnapshot:
		if !snapshot {
			return ""
		}
		begin += " ISOLATION LEVEL REPEATABLE READ"
	case sql.LevelSerializable:
		begin += " ISOLATION LEVEL SERIALIZABLE"
	default:
		return ""
	}
	if opts.ReadOnly {
		begin += " READ ONLY"
	}
	return begin
}

// beginMessage is a connection's last composed BEGIN message, reused while
// its transactions begin alike (one code path's, at one call site), so
// that a repeated transaction composes nothing.
type beginMessage struct {
	site    string // where the transaction began, as its identity names it ("" when it publishes none)
	opts    driver.TxOptions
	id      bool // it queries RunInTx's transaction id
	publish bool // it sets the identity
	text    string
	cols    int // the columns of the row it returns (0: none; 1: the id)
}

// compose builds the message for m's fields; appName is the identity.
// The id query sets the identity in its FROM clause, so that its row has
// one column (each column costs the driver allocations to read).
func (m *beginMessage) compose(begin string, idFirst bool, appName string) {
	var query string
	switch {
	case m.id && m.publish:
		query = retry.XIDQuery + " FROM (SELECT " + identity.SetAppName(appName, true, 0) + ") AS lockhooks_identity"
	case m.id:
		query = retry.XIDQuery
	default:
		query = "SELECT " + identity.SetAppName(appName, true, 0)
	}
	if m.id {
		m.cols = 1
	}
	if m.id && idFirst {
		m.text = query + "; " + begin
	} else {
		m.text = begin + "; " + query
	}
}

// beginOwn begins a Postgres transaction with lockhooks' own BEGIN when
// BEGIN's round trip has something to carry: RunInTx's transaction id (ctx
// carries its *retry.CommitInfo) or the transaction's identity (the connection
// publishes one; transaction-local, it ends with the transaction). site is
// where the transaction began. ok is false where the driver's BeginTx
// begins it instead.
func (c *conn) beginOwn(ctx context.Context, opts driver.TxOptions, site *callsite.Stack) (t driver.Tx, ok bool, err error) {
	own := c.connector.own.Of(c.inner)
	if !own.OK() || c.queryer == nil || c.execer == nil {
		return nil, false, nil
	}
	begin := beginClause(opts, own.PGX)
	if begin == "" {
		return nil, false, nil
	}
	info := retry.InfoOf(ctx)
	// Through pgx, a transaction at another level cannot learn its id at
	// BEGIN: RunInTx reads it before COMMIT.
	id := info != nil && (!own.IDFirst || opts.Isolation == driver.IsolationLevel(sql.LevelDefault))
	publish := c.pin.Who.Publishes
	if !id && !publish {
		return nil, false, nil
	}
	m := &c.tx.msg
	var where string
	if publish {
		where = c.connector.sites.Of(site)
	}
	if m.text == "" || m.site != where || m.opts != opts || m.id != id || m.publish != publish {
		*m = beginMessage{site: where, opts: opts, id: id, publish: publish}
		var appName string
		if publish {
			appName = c.pin.TxAppName(where)
		}
		m.compose(begin, own.IDFirst, appName)
	}
	// As for the driver's BeginTx (see conn.BeginTx): a context cancelled
	// in the middle would make pgx close the connection. COMMIT runs with
	// the same context.
	ownCtx := context.WithoutCancel(ctx)
	err = c.noteRoundTrip(m.text, func() (err error) { // the backend's last statement (pg_loss.go)
		if m.cols == 0 {
			_, err = c.execer.ExecContext(ownCtx, m.text, nil)
			return err
		}
		return c.beginRow(ownCtx, m, own.Args, info)
	})
	if err != nil {
		if dberr.FromServer(err) {
			// BEGIN may have run before the statement that failed (lib/pq's
			// order, or the identity after BEGIN): leave no transaction
			// block behind.
			c.ExecOwn(context.Background(), "ROLLBACK")
		}
		if dberr.SQLState(err) == "42601" || strings.Contains(err.Error(), "simple protocol") {
			// The driver prepared the text instead of sending it as it is
			// ("cannot insert multiple commands into a prepared
			// statement"), or refused the simple protocol (pgx does
			// without standard_conforming_strings): nothing ran; the
			// driver begins every transaction from now on.
			own.Disabled.Store(true)
			return nil, false, nil
		}
		return nil, true, c.Observe(err)
	}
	if info != nil {
		info.Begun = id
	}
	tx := c.tx.begin(ctx, pgTx{c}, opts, site)
	tx.ownCtx = ownCtx
	return tx, true, nil
}

// beginRow runs a BEGIN message that returns RunInTx's transaction id
// (its row's first column), into info.
func (c *conn) beginRow(ctx context.Context, m *beginMessage, args []driver.NamedValue, info *retry.CommitInfo) error {
	rows, err := c.queryer.QueryContext(ctx, m.text, args)
	if err != nil {
		return err
	}
	row := c.tx.row[:m.cols]
	err = rows.Next(row)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err == io.EOF {
		err = fmt.Errorf("lockhooks: %q returned no row", m.text)
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

// errTxAborted is pgTx.Commit's error for a transaction that a failed
// statement aborted, read from pgx's transaction status: it was rolled
// back. It reads as Postgres's 25P02.
var errTxAborted = &txAbortedError{}

type txAbortedError struct{}

func (*txAbortedError) Error() string {
	return "lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it (in_failed_sql_transaction), and it was rolled back instead of committed"
}

// SQLState makes it classify as Postgres's in_failed_sql_transaction.
func (*txAbortedError) SQLState() string { return "25P02" }

// commitGuarded is COMMIT after a statement that fails in an aborted
// transaction: a plain COMMIT there is answered ROLLBACK, without an
// error a driver's Exec would report.
const commitGuarded = "SELECT 1; COMMIT"

// pgTx is a Postgres transaction that lockhooks began itself (beginOwn),
// ended by its own COMMIT and ROLLBACK. Like the driver's, they run with
// the context BeginTx was given, minus its cancellation (see
// conn.BeginTx).
type pgTx struct{ c *conn }

// Commit commits, failing in a transaction that a failed statement
// aborted (rolled back instead: errTxAborted, or commitGuarded's 25P02).
// Through pgx the transaction's status comes from the server's last
// ReadyForQuery (no statement): COMMIT alone in a live transaction. After a
// failure the server reported, the transaction is ended, so that the
// connection is never left inside it.
func (t pgTx) Commit() error {
	ctx := t.c.tx.ownCtx
	if ctx == nil {
		ctx = context.Background()
	}
	text := commitGuarded
	if status := t.c.tx.status; status != nil {
		switch status.TxStatus() {
		case 'E': // in a failed transaction block
			if err := t.c.ExecOwn(context.Background(), "ROLLBACK"); err != nil {
				return err
			}
			return errTxAborted
		case 'T':
			text = "COMMIT"
		}
	}
	// A connection that holds session locks keeps naming their holder in
	// its last statement (pg_identity_publish.go): the annotation leads
	// COMMIT and ROLLBACK too.
	note, _ := t.c.holderNote()
	err := t.c.ExecOwn(ctx, note+text)
	if err == nil || !dberr.FromServer(err) {
		return err
	}
	// After the guard the block is still open; after COMMIT, a no-op.
	if rerr := t.c.ExecOwn(context.Background(), "ROLLBACK"); rerr != nil && dberr.SQLState(err) == "25P02" {
		return fmt.Errorf("lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it (%w), and its ROLLBACK failed too: %w", err, rerr)
	}
	if dberr.SQLState(err) == "25P02" {
		return fmt.Errorf("lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it, and it was rolled back instead of committed: %w", err)
	}
	return err
}

// Rollback rolls back (naming the holder of the connection's session
// locks, as Commit does).
func (t pgTx) Rollback() error {
	note, _ := t.c.holderNote()
	return t.c.ExecOwn(context.Background(), note+"ROLLBACK")
}

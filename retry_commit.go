package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// RunInTx's commit path on Postgres: what it must know to resolve a COMMIT
// whose reply was cut off, learnt without a round trip of its own.
//
// A COMMIT cut off in flight can be resolved only through the transaction's
// id (pg_xact_status), and the id must be known before COMMIT is sent: its
// reply is what gets lost. Reading it just before COMMIT costs a round trip
// per attempt, and finds none in a transaction whose only effect is a
// NOTIFY (Postgres assigns that one its id inside COMMIT). So lockhooks
// assigns every attempt its id at BEGIN, in the same round trip: it sends
// the BEGIN itself, in one simple-protocol message with a query of the id.
// A transaction that
// writes nothing then has an id as well: its COMMIT writes a commit record,
// without waiting for the disk (Postgres commits asynchronously a
// transaction that wrote no WAL before COMMIT), and uses up one transaction
// id. On a standby, where nothing can be written or notified, no id is
// assigned (pg_is_in_recovery()). A transaction that a failed statement
// aborted must not be answered COMMIT's silent ROLLBACK: through pgx,
// lockhooks asks the connection's transaction status (PgConn.TxStatus,
// from the server's last ReadyForQuery, so no round trip) and rolls back
// instead of committing; through other drivers COMMIT is sent as
// "SELECT 1; COMMIT", which fails at the SELECT (25P02).
//
// The simple protocol through database/sql, without naming the driver's
// types (the root package imports no driver): lib/pq runs every query
// without arguments that way, and returns the rows of the text's first
// statement that has some; pgx's stdlib runs a query that way when its
// first argument is pgx's QueryExecModeSimpleProtocol (a value found by
// reflection, once per database), and returns only the first statement's
// result, so the id is queried before BEGIN. Statements before BEGIN in one
// message form an implicit transaction that BEGIN turns into the
// transaction block, keeping its id, but a query there fixes the isolation
// level: through pgx only transactions at the default level begin this
// way. Other transactions, and other drivers, read the id before COMMIT
// instead, in a round trip of their own.

// commitInfo is what RunInTx learns about an attempt's transaction; the
// wrapped connection fills it in when it begins the transaction itself.
type commitInfo struct {
	begun bool   // lockhooks sent BEGIN, with the id query
	xid   string // the transaction id; "" on a standby (nothing can be written there)
}

// commitInfoKey carries RunInTx's *commitInfo in BeginTx's context.
type commitInfoKey struct{}

// runInTxContext is the context RunInTx begins its transactions with: the
// caller's, which fn's statements run with, carrying the attempt's
// *commitInfo (nil: no commit check) and RunInTx's fn, which the
// transaction records as its call chain (selfwait.go): a wait of fn on
// this transaction is a self-wait (ErrSelfWait). RunInTx passes a pointer
// to the one in its runner.
type runInTxContext struct {
	context.Context
	info *commitInfo
	run  *fnRun
}

// Value returns the *commitInfo for commitInfoKey.
func (c *runInTxContext) Value(key any) any {
	if _, ok := key.(commitInfoKey); ok {
		if c.info == nil {
			return nil
		}
		return c.info
	}
	return c.Context.Value(key)
}

// The statements of the commit path.
const (
	// xidQuery assigns the transaction its id (none on a standby).
	xidQuery = "SELECT (CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_xact_id() END)::text"
	// commitGuarded is COMMIT after a statement that fails in an aborted
	// transaction.
	commitGuarded = "SELECT 1; COMMIT"
)

// beginTexts are the texts of lockhooks' BEGIN round trip, by whether the
// id is queried first (pgx), isolation level (database/sql's, up to
// Serializable) and read-only.
var beginTexts = func() (texts [2][sql.LevelSerializable + 1][2]string) {
	for first := range 2 {
		for level := range sql.LevelSerializable + 1 {
			for ro := range 2 {
				begin := "BEGIN"
				switch level {
				case sql.LevelDefault:
				case sql.LevelReadCommitted:
					begin += " ISOLATION LEVEL READ COMMITTED"
				case sql.LevelRepeatableRead, sql.LevelSnapshot:
					begin += " ISOLATION LEVEL REPEATABLE READ"
				case sql.LevelSerializable:
					begin += " ISOLATION LEVEL SERIALIZABLE"
				default:
					continue // READ UNCOMMITTED, WRITE COMMITTED: the driver's BeginTx decides
				}
				if ro == 1 {
					begin += " READ ONLY"
				}
				if first == 1 {
					texts[first][level][ro] = xidQuery + "; " + begin
				} else {
					texts[first][level][ro] = begin + "; " + xidQuery
				}
			}
		}
	}
	return texts
}()

// simpleQuery is how a database's inner connections run a text of several
// statements in one simple-protocol round trip and return rows: found from
// the first connection, once.
type simpleQuery struct {
	once     sync.Once
	ok       bool
	args     []driver.NamedValue // arguments that select the simple protocol
	idFirst  bool                // only the first statement's rows come back
	pgx      bool                // the connections are pgx's (their TxStatus can be read)
	disabled atomic.Bool         // the driver did not run the text as expected
}

// errTxAborted is pgTx.Commit's error for a transaction that a failed
// statement aborted: it was rolled back. It reads as Postgres's 25P02.
var errTxAborted = &txAbortedError{}

type txAbortedError struct{}

func (*txAbortedError) Error() string {
	return "lockhooks: the transaction was aborted by a statement that failed (in_failed_sql_transaction), so it was rolled back instead of committed"
}

// SQLState makes it classify as Postgres's in_failed_sql_transaction.
func (*txAbortedError) SQLState() string { return "25P02" }

// pgxTxStatus returns the TxStatus method of the pgx connection behind a
// pgx stdlib connection (its Conn().PgConn()), as a plain func, or nil.
func pgxTxStatus(inner driver.Conn) func() byte {
	v := reflect.ValueOf(inner)
	for _, name := range []string{"Conn", "PgConn"} {
		m := v.MethodByName(name)
		if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
			return nil
		}
		if v = m.Call(nil)[0]; v.Kind() != reflect.Pointer || v.IsNil() {
			return nil
		}
	}
	f, _ := v.MethodByName("TxStatus").Interface().(func() byte)
	return f
}

// of returns the simple-protocol arguments for inner's driver.
func (s *simpleQuery) of(inner driver.Conn) (*simpleQuery, bool) {
	s.once.Do(func() {
		t := reflect.TypeOf(inner)
		if t.Kind() != reflect.Pointer {
			return
		}
		switch t.Elem().PkgPath() {
		case "github.com/lib/pq":
			s.ok = true
		case "github.com/jackc/pgx/v5/stdlib":
			if mode, ok := pgxSimpleProtocol(t); ok {
				s.ok, s.idFirst, s.pgx = true, true, true
				s.args = []driver.NamedValue{{Ordinal: 1, Value: mode}}
			}
		}
	})
	return s, s.ok && !s.disabled.Load()
}

// pgxSimpleProtocol finds pgx's QueryExecModeSimpleProtocol from the type
// of its stdlib connection: Conn() *pgx.Conn, whose Config() has the field
// DefaultQueryExecMode of type QueryExecMode, whose String names the mode.
func pgxSimpleProtocol(stdlibConn reflect.Type) (any, bool) {
	conn, ok := stdlibConn.MethodByName("Conn")
	if !ok || conn.Type.NumOut() != 1 {
		return nil, false
	}
	config, ok := conn.Type.Out(0).MethodByName("Config")
	if !ok || config.Type.NumOut() != 1 || config.Type.Out(0).Kind() != reflect.Pointer {
		return nil, false
	}
	field, ok := config.Type.Out(0).Elem().FieldByName("DefaultQueryExecMode")
	if !ok || field.Type.Kind() != reflect.Int32 {
		return nil, false
	}
	for i := range int64(16) {
		v := reflect.New(field.Type).Elem()
		v.SetInt(i)
		if s, ok := v.Interface().(fmt.Stringer); ok && strings.ReplaceAll(s.String(), "_", " ") == "simple protocol" {
			return v.Interface(), true
		}
	}
	return nil, false
}

// beginForRunInTx begins a transaction for RunInTx with lockhooks' own
// BEGIN, learning its id in the same round trip; ok is false when the
// driver or the options do not allow it (the caller then begins as usual).
func (c *conn) beginForRunInTx(ctx context.Context, opts driver.TxOptions, info *commitInfo) (tx driver.Tx, ok bool, err error) {
	sq, ok := c.connector.ownBegin.of(c.inner)
	if !ok || c.queryer == nil {
		return nil, false, nil
	}
	level := sql.IsolationLevel(opts.Isolation)
	if level > sql.LevelSerializable || level != sql.LevelDefault && sq.idFirst {
		return nil, false, nil // the driver's own BeginTx
	}
	first, ro := 0, 0
	if sq.idFirst {
		first = 1
	}
	if opts.ReadOnly {
		ro = 1
	}
	text := beginTexts[first][level][ro]
	if text == "" {
		return nil, false, nil // a level Postgres does not have: the driver's BeginTx says what it makes of it
	}
	// As for the driver's BeginTx (see conn.BeginTx): a context cancelled
	// in the middle would make pgx close the connection. COMMIT runs with
	// the same context.
	ownCtx := context.WithoutCancel(ctx)
	rows, err := c.queryer.QueryContext(ownCtx, text, sq.args)
	if err != nil && isServerError(err) {
		// BEGIN may have run before the statement that failed (lib/pq's
		// order): leave no transaction block behind.
		c.execOwn(context.Background(), "ROLLBACK")
	}
	if err != nil {
		if sqlState(err) == "42601" || strings.Contains(err.Error(), "simple protocol") {
			// The driver prepared the text instead of sending it as it is
			// ("cannot insert multiple commands into a prepared
			// statement"), or refused the simple protocol (pgx does
			// without standard_conforming_strings): nothing ran; begin as
			// usual from now on.
			sq.disabled.Store(true)
			return nil, false, nil
		}
		return nil, true, c.observe(err)
	}
	row := c.tx.row[:]
	err = rows.Next(row)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err == io.EOF {
		err = fmt.Errorf("lockhooks: %q returned no row", text)
	}
	info.xid = textOf(row[0])
	row[0] = nil
	if err != nil {
		// The transaction may have begun: end it, whatever state it is in.
		c.execOwn(context.Background(), "ROLLBACK")
		return nil, true, c.observe(err)
	}
	info.begun = true
	if sq.pgx && c.tx.status == nil {
		c.tx.status = pgxTxStatus(c.inner) // once per connection
	}
	t := c.tx.begin(ctx, pgTx{c}, opts)
	t.ownCtx = ownCtx
	return t, true, nil
}

// textOf returns a text column's value as a string ("" for NULL).
func textOf(v driver.Value) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return fmt.Sprint(v)
}

// pgTx is a Postgres transaction that lockhooks began itself (for
// RunInTx), ended by its own COMMIT and ROLLBACK. Like the driver's, they
// run with the context BeginTx was given, minus its cancellation (see
// conn.BeginTx).
type pgTx struct{ c *conn }

// Commit commits, failing in a transaction that a failed statement
// aborted (rolled back instead: errTxAborted, or commitGuarded's 25P02).
// After a failure the server reported, the transaction is ended, so that
// the connection is never left inside it.
func (t pgTx) Commit() error {
	ctx := t.c.tx.ownCtx
	if ctx == nil {
		ctx = context.Background()
	}
	text := commitGuarded
	if status := t.c.tx.status; status != nil {
		switch status() {
		case 'E': // in a failed transaction block
			if err := t.c.execOwn(context.Background(), "ROLLBACK"); err != nil {
				return err
			}
			return errTxAborted
		case 'T':
			text = "COMMIT"
		}
	}
	err := t.c.execOwn(ctx, text)
	if err != nil && isServerError(err) {
		t.c.execOwn(context.Background(), "ROLLBACK") // after the guard the block is still open; after COMMIT, a no-op
	}
	return err
}

// Rollback rolls back.
func (t pgTx) Rollback() error {
	return t.c.execOwn(context.Background(), "ROLLBACK")
}

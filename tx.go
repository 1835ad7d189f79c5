package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/pgbegin"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
)

// immediateTx is an SQLite write transaction begun with BEGIN IMMEDIATE
// (or EXCLUSIVE) by the wrapper itself, where the driver does not begin it
// that way (drivers cannot choose the BEGIN mode per transaction; modernc
// can be told one mode for all write transactions, see sqlitelock.DSN.PlanModerncBegin). Its
// COMMIT and ROLLBACK have the semantics modernc.org/sqlite gives its own
// transactions: COMMIT waits for other connections' locks only as long as
// the context BeginTx was given allows (database/sql documents that
// context as in use until the end of the transaction), and ROLLBACK runs
// whatever that context's state, because database/sql calls it to clean up
// once the context is done.
// It is one pointer, so storing it in tx.inner allocates nothing; BeginTx's
// context is kept in tx.ctx.
type immediateTx struct{ c *conn }

// Commit commits. If COMMIT fails the transaction is rolled back, so the
// connection is never left inside it; the writer lock is released by the
// wrapping tx whatever happens here.
func (t immediateTx) Commit() error {
	ctx := t.c.tx.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	err := t.c.ExecOwn(ctx, "COMMIT")
	if err == nil {
		return nil
	}
	rerr := t.c.ExecOwn(context.Background(), "ROLLBACK")
	if rerr != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The driver reports the context's error for a statement during
		// which the context ended, even one that completed; a transaction
		// that is gone without our ROLLBACK may have committed.
		return fmt.Errorf("lockhooks: COMMIT ended with %w as its context ended, and the transaction was no longer open afterwards (ROLLBACK: %v), so it may have committed; check the data before retrying", err, rerr)
	}
	return err
}

// Rollback rolls back.
func (t immediateTx) Rollback() error {
	return t.c.ExecOwn(context.Background(), "ROLLBACK")
}

// tx is the wrapped transaction. It lives inside its conn (database/sql runs
// one transaction per connection at a time), so beginning one allocates
// nothing; what must happen after COMMIT or ROLLBACK happens here.
type tx struct {
	c     *conn
	inner driver.Tx
	opts  driver.TxOptions
	ctx   context.Context // BeginTx's, in use until COMMIT or ROLLBACK
	run   *callsite.Run   // RunInTx's fn, if RunInTx began it (selfwait.go)
	gen   uint64          // tells this connection's transactions apart, as lock owners

	read   bool                   // a statement ran in the transaction (its snapshot is fixed)
	writer bool                   // the transaction holds the SQLite writer lock
	locks  []inprocess.LocksetKey // lockset holds to release after COMMIT/ROLLBACK
	held   stmtlocks.Tx           // the locks lockhooks saw it take (DeadlockError, lock-order checker)

	// For hold times: the span of BeginTx's context, and when the
	// transaction first took each kind of lock (zero: never).
	span                                           trace.Span
	rowSince, xactSince, locksetSince, writerSince time.Time

	// For a transaction lockhooks began itself (pgTx, pg_begin.go): the
	// context of its COMMIT, the connection's last BEGIN message and a
	// buffer for its row; and, from Connect on, its pgx connection's
	// transaction status (nil: not pgx).
	ownCtx context.Context
	msg    pgbegin.Message
	row    [1]driver.Value
	status pgdriver.TxStatuser
}

var _ driver.Tx = (*tx)(nil)

// begin starts tracking the transaction inner, begun at site (Postgres;
// nil: not recorded), and returns it wrapped.
func (t *tx) begin(ctx context.Context, inner driver.Tx, opts driver.TxOptions, site *callsite.Stack) *tx {
	t.inner, t.opts, t.ctx = inner, opts, ctx
	t.gen++
	t.read = false
	t.held.Reset()
	t.span = trace.SpanFromContext(ctx)
	if t.run = runOf(ctx); t.run != nil {
		t.c.selfRun.Store(t.run) // self-waits of fn on other connections (selfwait.go)
	}
	if t.c.connector.pins != nil {
		// Postgres: other connections' waiters find this transaction by its
		// backend pid (or the identity its BEGIN published) and name where
		// it began.
		idCtx := ctx
		if rc, ok := ctx.(*runInTxContext); ok {
			idCtx = rc.Context // the context RunInTx's fn runs with
		}
		t.c.ident.Began(idCtx, time.Now(), site)
	}
	return t
}

// took notes the first time the transaction took a kind of lock.
func (t *tx) took(since *time.Time) {
	if since.IsZero() {
		*since = time.Now()
	}
}

// TookInTx notes, in c's open transaction if it has one, when it first
// took row locks (row) or transaction-level locks (pgstmt.Conn).
func (c *conn) TookInTx(row bool) {
	switch {
	case c.tx.inner == nil:
	case row:
		c.tx.took(&c.tx.rowSince)
	default:
		c.tx.took(&c.tx.xactSince)
	}
}

// readOnly reports whether the transaction was begun read-only.
func (t *tx) readOnly() bool { return t.opts.ReadOnly }

// Commit commits the inner transaction, then runs what waits for its end.
func (t *tx) Commit() (err error) {
	if hook := t.c.connector.opts.testReleaseBeforeCommit; hook != nil && len(t.locks) > 0 {
		t.releaseLast(len(t.locks))
		hook()
	}
	defer t.end() // even if the driver panics: the writer lock must not stay held
	if t.c.pin.Hold.Conn() != nil {
		// Through a transaction pooler the work commits on another server
		// connection than the one keeping its session locks: not after
		// the lock is lost.
		ctx := t.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		if err := t.c.pin.Hold.Check(ctx); err != nil {
			t.inner.Rollback()
			return err
		}
	}
	return t.c.txEnded(t.c.Observe(t.c.noted(t.inner.Commit)))
}

// Rollback rolls back the inner transaction, then runs what waits for its
// end. database/sql also calls it when the transaction's context ends.
func (t *tx) Rollback() error {
	defer t.end()
	return t.c.txEnded(t.c.Observe(t.c.noted(t.inner.Rollback)))
}

// noted runs end (the driver's COMMIT or ROLLBACK) and, on Postgres, notes
// it as the backend's last statement, should the connection break
// (pg_loss.go).
func (c *conn) noted(end func() error) error {
	if c.connector.pins == nil {
		return end()
	}
	return c.noteRoundTrip("", end)
}

// txEnded looks at what COMMIT or ROLLBACK returned: a connection that broke
// there may leave its backend, half-open, holding the transaction's locks;
// the ones lockhooks saw it take have it ended (Postgres).
func (c *conn) txEnded(err error) error {
	if err != nil && c.connector.pins != nil && !dberr.FromServer(err) {
		c.endTransactionLocks()
	}
	return err
}

// end runs once COMMIT or ROLLBACK returned (whatever it returned): it
// releases the transaction's lockset holds and the SQLite writer lock,
// and, if a statement in it changed session locks in ways only pg_locks
// can tell, reads pg_locks now that the transaction's own locks are gone.
func (t *tx) end() {
	t.inner, t.ctx, t.ownCtx, t.run = nil, nil, nil, nil
	t.c.selfRun.Store(nil)
	if t.c.connector.pins != nil {
		t.c.ident.Ended()
	}
	t.opts = driver.TxOptions{}
	t.held.Reset()
	if len(t.locks) > 0 {
		t.releaseLast(len(t.locks))
	}
	if t.writer {
		t.writer = false
		t.c.connector.writer.unlock()
	}
	t.recordHolds()
	if t.c.connector.pins != nil {
		t.c.pin.TransactionEnded()
	}
}

// recordHolds records, per kind of lock the transaction took, how long it
// held them: a histogram point, and an event on the span of BeginTx's
// context.
func (t *tx) recordHolds() {
	ctx := context.Background()
	for _, h := range [...]struct {
		kind  string
		since *time.Time
	}{{"row", &t.rowSince}, {"advisory", &t.xactSince}, {"lockset", &t.locksetSince}, {"sqlite_writer", &t.writerSince}} {
		if h.since.IsZero() {
			continue
		}
		t.c.connector.tel.RecordHold(ctx, h.kind, "transaction", *h.since)
		if t.span != nil && t.span.IsRecording() {
			t.span.AddEvent("lockhooks.locks.released", trace.WithAttributes(
				AttrLockKind.String(h.kind), AttrLockScope.String("transaction"),
				attribute.Float64("lockhooks.lock.held_seconds", time.Since(*h.since).Seconds())))
		}
		*h.since = time.Time{}
	}
	t.span = nil
}

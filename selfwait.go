package lockhooks

import (
	"context"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/inprocess"
)

// Self-waits: a statement that would wait for a lock held by a transaction
// of its own call chain. The usual mistake is a statement run on the
// *sql.DB inside RunInTx's fn, instead of on the transaction:
//
//	lockhooks.RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
//		tx.ExecContext(ctx, "UPDATE jobs …")   // takes the SQLite writer lock
//		db.ExecContext(ctx, "UPDATE jobs …")   // waits for tx, which waits for it
//	})
//
// Such a wait can end only by its timeout. lockhooks fails it at once, with
// an error wrapping ErrSelfWait that RunInTx does not retry, only when the
// holder is provably on the waiter's own stack: a transaction of a RunInTx
// attempt whose fn is running on the waiting goroutine. On Postgres the
// same holds for row locks (SELECT … FOR UPDATE/SHARE through the *sql.DB:
// the server is asked whether the statement waits for that transaction,
// and the statement cancelled if so, where both connections reach the
// server itself and no pooler is declared or seen; through a pooler the
// wait is only likely a self-wait),
// advisory locks and Lock; an UPDATE or DELETE that waits for a row is not
// probed, and waits until a timeout ends it. Any other wait that looks like
// one (the holder began, or took its lock, on this goroutine with this
// context, but might have been handed to another goroutine) waits as
// before, and its timeout error and slow-wait log line say it is likely a
// self-wait.

// ErrSelfWait is wrapped by the error of a statement (or BeginTx, Lock,
// AcquireAdvisoryLock) that would wait for a lock held by the transaction
// of a RunInTx attempt whose fn is running on the very goroutine that
// waits: fn is blocked in the wait, so the transaction cannot end before
// the wait's timeout. It fires for SQLite's writer lock, Lock's ids,
// Postgres advisory locks and Postgres row-locking SELECTs (FOR UPDATE,
// FOR SHARE …; where both connections reach the server itself and no
// pooler is declared or seen) run on the *sql.DB instead of the
// transaction, with any context, and RunInTx does not retry it. Run the
// statement through the transaction (tx.ExecContext, not
// db.ExecContext). A transaction begun
// with db.BeginTx, an AdvisoryLock, or a holder of another database (or
// *sql.DB) is never taken for a self-wait: it may be handed to another
// goroutine that ends it, so the wait goes on, and its timeout error and
// slow-wait log line say when it is likely one. (On architectures other
// than amd64 and arm64, where lockhooks cannot tell goroutines apart
// cheaply, every wait waits.)
var ErrSelfWait = inprocess.ErrSelfWait

// runOf returns the fn of RunInTx whose BeginTx context ctx is, or nil.
func runOf(ctx context.Context) *callsite.Run {
	if rc, ok := ctx.(*runInTxContext); ok {
		return rc.run
	}
	return nil
}

// chainOf is the current goroutine's call chain, with ctx, for a hold of
// run's transaction (run may be nil). RunInTx's BeginTx context counts as
// the caller's, which fn's statements run with.
func chainOf(ctx context.Context, run *callsite.Run) callsite.Chain {
	if rc, ok := ctx.(*runInTxContext); ok {
		ctx = rc.Context
	}
	return callsite.ChainOf(ctx, run)
}

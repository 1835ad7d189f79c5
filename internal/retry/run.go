package retry

import (
	"context"
	"time"
)

// Attempts is an adapter's side of RunInTx's loop (database/sql's, or a
// pgx pool's): one attempt's transaction, whether its error is worth
// another attempt, and what happens before a retry.
type Attempts interface {
	// Attempt runs one transaction (RunAttempt, over the adapter's
	// transaction type).
	Attempt(ctx context.Context) error
	// Retryable reports whether an attempt's error is worth another
	// attempt (usually Config.Retryable, with the adapter's own errors).
	Retryable(err error) bool
	// Retrying is told of a failed attempt (from 1) that is about to be
	// retried after wait.
	Retrying(ctx context.Context, attempt int, err error, wait time.Duration)
}

// Outcome is how RunInTx's loop ended without success: how many attempts
// ran, the last one's error, whether no attempts were left for a
// retryable one, and the context's cause when it ended between attempts.
type Outcome struct {
	Attempts  int
	Err       error
	Exhausted bool
	Ctx       error
}

// Loop runs a's attempts until one succeeds (ok), one fails with an error
// a does not retry, ctx ends, or MaxAttempts ran; between attempts it
// waits a jittered backoff (Backoff.After), honouring ctx.
func (c *Config) Loop(ctx context.Context, a Attempts) (out Outcome, ok bool) {
	for attempt := 1; ; attempt++ {
		err := a.Attempt(ctx)
		if err == nil {
			return Outcome{}, true
		}
		if !a.Retryable(err) {
			return Outcome{Attempts: attempt, Err: err}, false
		}
		if ctx.Err() != nil {
			return Outcome{Attempts: attempt, Err: err, Ctx: context.Cause(ctx)}, false
		}
		if attempt >= c.MaxAttempts {
			return Outcome{Attempts: attempt, Err: err, Exhausted: true}, false
		}
		wait := c.Backoff.After(attempt)
		a.Retrying(ctx, attempt, err, wait)
		if wait > 0 {
			if cause := Sleep(ctx, wait); cause != nil {
				return Outcome{Attempts: attempt, Err: err, Ctx: cause}, false
			}
		}
	}
}

// Tx is an adapter's transaction type as one attempt drives it (RunAttempt).
type Tx[T any] interface {
	// Begin begins the attempt's transaction with ctx.
	Begin(ctx context.Context) (T, error)
	// Run runs the caller's fn in tx (marked as running on this
	// goroutine while it does).
	Run(tx T) error
	// Rollback rolls tx back.
	Rollback(tx T) error
	// ReadXID assigns the transaction its id and reads it, in a round trip
	// of its own (XIDQuery).
	ReadXID(ctx context.Context, tx T) (string, error)
	// Commit commits tx.
	Commit(tx T) error
	// Done reports whether err says the transaction was over already
	// (database/sql's ErrTxDone): a ROLLBACK that says so leaves the
	// connection fine; a COMMIT that says so was never sent (database/sql
	// rolled the transaction back when its context ended).
	Done(err error) bool
	// Server asks the server what became of a COMMIT cut off in flight,
	// on a connection other than the broken one.
	Server() Server
}

// RunAttempt runs one attempt on a: begin, fn, the transaction id where
// BEGIN did not learn it (Postgres with the commit check on), COMMIT; a
// transaction left open by a panicking fn is rolled back. info is the
// attempt's (reset here; BEGIN fills it in where it can). Errors are
// classified for the loop: BeginFailed, fn's error (a broken connection
// only where the transaction's ROLLBACK says the connection broke too:
// fn may fail with errors of its own that look like one, io.EOF or a
// network error from an HTTP call, and retrying those would run its
// external calls again for nothing), XIDFailed, and what a failed COMMIT
// means (CommitFailed).
func RunAttempt[T any](ctx context.Context, c *Config, a Tx[T], info *CommitInfo, postgres bool) (err error) {
	*info = CommitInfo{}
	tx, err := a.Begin(ctx)
	if err != nil {
		return BeginFailed(ctx, err)
	}
	done := false
	defer func() {
		if !done {
			a.Rollback(tx) // fn panicked: the transaction must not stay open
		}
	}()
	if err = a.Run(tx); err != nil {
		done = true
		if rerr := a.Rollback(tx); rerr == nil || a.Done(rerr) {
			return err // the connection is fine: not a broken one
		}
		return BeforeCommit(ctx, err)
	}
	if postgres && c.CommitCheck && !info.Begun {
		// The transaction began without its id (a driver or an isolation
		// level that BEGIN's round trip cannot serve): assign and read it
		// now, in a round trip of its own.
		xid, err := a.ReadXID(ctx, tx)
		if err != nil {
			done = true
			a.Rollback(tx)
			return XIDFailed(ctx, err)
		}
		info.XID = xid
	}
	done = true
	if err = a.Commit(tx); err == nil {
		return nil
	}
	if a.Done(err) {
		return err // COMMIT was never sent
	}
	return c.CommitFailed(ctx, err, postgres, info.XID, a.Server())
}

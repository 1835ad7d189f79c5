package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/retry"
)

// ErrAmbiguousCommit is wrapped by the error [RunInTx] returns when COMMIT
// failed in a way that leaves its outcome unknown (the connection broke
// while COMMIT was in flight) and the server could not say what became of
// the transaction. The transaction may or may not have committed: check
// its effects before doing it again.
var ErrAmbiguousCommit = retry.ErrAmbiguousCommit

// A RetryOption adjusts one [RunInTx] call.
type RetryOption func(*retryConfig)

// retryConfig is one RunInTx call's configuration: internal/retry's, and
// the callback that takes the root's RetryEvent.
type retryConfig struct {
	retry.Config
	onRetry func(RetryEvent)
}

// MaxAttempts sets how many times RunInTx runs the transaction at most,
// the first run included (default 10). n < 1 means 1.
func MaxAttempts(n int) RetryOption {
	return func(c *retryConfig) { c.MaxAttempts = max(n, 1) }
}

// Backoff sets the wait before a retry: a random duration between 0 and
// min(limit, base·2^(attempt-1)) ("full jitter", so that the transactions
// that collided do not collide again in step). The default is 5ms doubling
// up to 1s.
func Backoff(base, limit time.Duration) RetryOption {
	return func(c *retryConfig) { c.Backoff = retry.Backoff{Base: max(base, 0), Cap: max(limit, base, 0)} }
}

// RetryLockNotAvailable makes RunInTx also retry the waits cut by a limit
// you set: Postgres's lock_not_available (SQLSTATE 55P03, raised by
// lock_timeout and NOWAIT) and SQLite's [ErrWriterLockTimeout] (the
// writer lock was not had within [WithBusyTimeout]). It is off by default
// because such limits are usually deliberate: the caller would rather fail
// than wait. With it, each attempt waits up to the limit again.
func RetryLockNotAvailable() RetryOption {
	return func(c *retryConfig) { c.LockNotAvailable = true }
}

// SkipCommitCheck turns off the resolution of ambiguous commits on
// Postgres: RunInTx then lets the driver send BEGIN and COMMIT, and gives
// the transaction no id of its own; a COMMIT cut off by a broken
// connection ends RunInTx with an error wrapping [ErrAmbiguousCommit].
func SkipCommitCheck() RetryOption {
	return func(c *retryConfig) { c.CommitCheck = false }
}

// CommitResolveTimeout bounds how long RunInTx keeps asking the server
// about a COMMIT cut off by a broken connection (default 10s), whatever
// the context says: the question must be answered even when the context
// ended during COMMIT.
func CommitResolveTimeout(d time.Duration) RetryOption {
	return func(c *retryConfig) { c.ResolveTimeout = d }
}

// OnRetry calls fn before each retry, with the attempt that failed and its
// error, e.g. to count retries in a metric or a test.
func OnRetry(fn func(RetryEvent)) RetryOption {
	return func(c *retryConfig) { c.onRetry = fn }
}

// RetryEvent describes a failed attempt that RunInTx is about to retry.
type RetryEvent struct {
	Attempt int           // the attempt that failed, from 1
	Err     error         // why it failed
	Wait    time.Duration // the backoff before the next attempt
}

// RetryError is the error of a [RunInTx] that did not succeed. It wraps the
// last attempt's error (and the context's error when the context ended
// between attempts), so errors.Is and errors.As see through it.
type RetryError struct {
	Attempts  int   // how many attempts ran
	Err       error // the last attempt's error
	Exhausted bool  // the last error was retryable, but no attempts were left
	Ctx       error // the context's error, if it ended while waiting to retry
}

// Error says how many attempts ran and why RunInTx stopped.
func (e *RetryError) Error() string {
	switch {
	case e.Ctx != nil:
		return fmt.Sprintf("lockhooks: RunInTx stopped after %d attempt%s because %v; the last attempt failed with: %v", e.Attempts, plural(e.Attempts), e.Ctx, e.Err)
	case e.Exhausted:
		return fmt.Sprintf("lockhooks: RunInTx gave up after %d attempts, all failed with retryable errors (raise the limit with lockhooks.MaxAttempts, or reduce contention); the last: %v", e.Attempts, e.Err)
	}
	return fmt.Sprintf("lockhooks: RunInTx attempt %d failed: %v", e.Attempts, e.Err)
}

// Unwrap returns the last attempt's error and the context's error.
func (e *RetryError) Unwrap() []error {
	if e.Ctx != nil {
		return []error{e.Err, e.Ctx}
	}
	return []error{e.Err}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// RunInTx runs fn in a transaction begun with opts and commits it,
// running it again while it fails with an error that a new attempt may
// not meet. Every attempt is a new transaction (BEGIN, never a savepoint
// restart, which on Postgres would keep the failed attempt's snapshot), so
// fn must do all its work through tx and may run more than once; it must
// not commit or roll back tx itself.
//
// What is retried: deadlocks (40P01), serialization failures (40001),
// SQLite's SQLITE_BUSY, SQLITE_BUSY_SNAPSHOT and SQLITE_LOCKED (see
// [IsRetryable]), a transaction the server ended for idling (25P03,
// idle_in_transaction_session_timeout), and a connection that broke before
// COMMIT was sent (the server rolls such a transaction back, so nothing was
// written). An error of fn's own that looks like a broken connection
// (io.EOF or a network error from an HTTP call inside fn) is not retried: it
// counts as the database's only when the transaction's connection broke too
// (its ROLLBACK fails). Waits cut by a limit you set are retried only with
// [RetryLockNotAvailable]: lock_not_available (55P03: lock_timeout, NOWAIT)
// and [ErrWriterLockTimeout] (an SQLite writer waited [WithBusyTimeout] for
// the writer lock; retrying would make the wait longer than the busy timeout
// says, each attempt waiting it again).
// Any other error from fn, BEGIN or COMMIT ends RunInTx at once. Between
// attempts it waits a jittered, exponentially growing, capped backoff
// ([Backoff]); at most [MaxAttempts] attempts run (default 10). ctx is
// honoured during attempts (it is the transaction's context) and between
// them. Locks taken with [Lock] belong to the attempt and are released
// with it, before the backoff.
//
// A COMMIT cut off by a broken connection (or by the server going away:
// SQLSTATE classes 08 and 57) is resolved, not guessed, whatever the
// transaction did (wrote, only sent a NOTIFY, or read): on Postgres (13 or
// later) every attempt is given a transaction id when it begins
// (pg_current_xact_id(); through lib/pq, and through pgx at the default
// isolation level, in BEGIN's own round trip, otherwise with one more
// round trip before COMMIT), and after such a failure RunInTx asks
// pg_xact_status() on another connection: "committed" is success,
// "aborted" is retried. While the server says "in progress" it asks again,
// for up to [CommitResolveTimeout]; a backend still idle in the
// transaction never got the COMMIT and never will, so RunInTx ends it
// (pg_terminate_backend), which aborts the transaction. An attempt that
// wrote nothing still commits a transaction id (its commit record is
// written without waiting for the disk). On a standby, where nothing can be
// written, no id is assigned and a cut COMMIT is retried. Only when the
// server cannot say (or on SQLite, or with [SkipCommitCheck]) does RunInTx
// return an error wrapping [ErrAmbiguousCommit]. A COMMIT that the server
// itself rejected (a deferred constraint, a serialization failure) did not
// commit and is classified like any other error.
//
// An error is returned as a *[RetryError] that says how many attempts ran
// and wraps the last cause. RunInTx works with any database/sql driver;
// locking features need a database opened through lockhooks.
func RunInTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error, options ...RetryOption) error {
	r := &runner{db: db, opts: opts, fn: fn, postgres: dialectOf(db) == Postgres}
	cfg := &r.cfg
	*cfg = retryConfig{Config: retry.Defaults()}
	for _, o := range options {
		if o != nil {
			o(cfg)
		}
	}
	r.run.Here()
	r.mark = runInTxContext{Context: ctx, run: &r.run} // see retry_commit.go
	if r.postgres && cfg.CommitCheck {
		r.mark.info = &r.info
	}
	ctx = &r.mark // a pointer into r: no allocation of its own
	out, ok := cfg.Loop(ctx, r)
	if ok {
		return nil
	}
	return &RetryError{Attempts: out.Attempts, Err: out.Err, Exhausted: out.Exhausted, Ctx: out.Ctx}
}

// dialectOf returns the dialect of db's driver, "" if it cannot tell.
func dialectOf(db *sql.DB) Dialect {
	d := db.Driver()
	w, ok := d.(*Driver)
	if !ok {
		dialect, _ := inferDialect(d)
		return dialect
	}
	if dialect, ok := inferDialect(w.inner); ok {
		return dialect
	}
	if o, err := resolveOptions(w.opts, w.inner); err == nil {
		return o.dialect
	}
	return ""
}

// runner is one RunInTx call.
type runner struct {
	db       *sql.DB
	opts     *sql.TxOptions
	fn       func(*sql.Tx) error
	cfg      retryConfig
	postgres bool
	info     retry.CommitInfo // the current attempt's transaction (Postgres, commit check on)
	run      callsite.Run     // fn, as its transactions record it (self-waits, selfwait.go)
	mark     runInTxContext   // the context its transactions begin with
}

// The runner is RunInTx's loop's adapter (retry.Attempts) and one
// attempt's over *sql.Tx (retry.Tx).
var (
	_ retry.Attempts    = (*runner)(nil)
	_ retry.Tx[*sql.Tx] = (*runner)(nil)
)

// Attempt runs one transaction (retry.RunAttempt).
func (r *runner) Attempt(ctx context.Context) error {
	return retry.RunAttempt[*sql.Tx](ctx, &r.cfg.Config, r, &r.info, r.postgres)
}

// Retryable reports whether an attempt's error is worth another attempt.
func (r *runner) Retryable(err error) bool {
	if errors.Is(err, ErrWriterLockTimeout) {
		return r.cfg.LockNotAvailable // the writer waited the busy timeout already
	}
	return r.cfg.Retryable(err)
}

// Retrying records a retry among the database's events and tells
// OnRetry's callback.
func (r *runner) Retrying(ctx context.Context, attempt int, err error, wait time.Duration) {
	noteRetry(ctx, r.db, attempt, err)
	if r.cfg.onRetry != nil {
		r.cfg.onRetry(RetryEvent{Attempt: attempt, Err: err, Wait: wait})
	}
}

// Begin begins an attempt's transaction.
func (r *runner) Begin(ctx context.Context) (*sql.Tx, error) { return r.db.BeginTx(ctx, r.opts) }

// Run runs fn, marked as running on this goroutine while it does (also
// if it panics).
func (r *runner) Run(tx *sql.Tx) error {
	r.run.SetRunning(true)
	defer r.run.SetRunning(false)
	return r.fn(tx)
}

// Rollback rolls an attempt's transaction back.
func (r *runner) Rollback(tx *sql.Tx) error { return tx.Rollback() }

// ReadXID assigns and reads the transaction's id (retry.XIDQuery).
func (r *runner) ReadXID(ctx context.Context, tx *sql.Tx) (string, error) {
	var xid sql.NullString
	err := tx.QueryRowContext(ctx, retry.XIDQuery).Scan(&xid)
	return xid.String, err
}

// Commit commits an attempt's transaction.
func (r *runner) Commit(tx *sql.Tx) error { return tx.Commit() }

// Done reports whether err is database/sql's: the transaction was over
// already.
func (r *runner) Done(err error) bool { return errors.Is(err, sql.ErrTxDone) }

// Server asks the questions of a commit's resolution on r's database.
func (r *runner) Server() retry.Server { return statusDB{r.db} }

// statusDB asks the questions of a commit's resolution on db, on a
// connection other than the broken one.
type statusDB struct{ db *sql.DB }

// Status runs retry.StatusQuery.
func (s statusDB) Status(ctx context.Context, xid string) (status string, valid, idle bool, err error) {
	var st sql.NullString
	err = s.db.QueryRowContext(ctx, retry.StatusQuery, xid).Scan(&st, &idle)
	return st.String, st.Valid, idle, err
}

// Terminate runs retry.TerminateQuery.
func (s statusDB) Terminate(ctx context.Context, xid string) error {
	_, err := s.db.ExecContext(ctx, retry.TerminateQuery, xid)
	return err
}

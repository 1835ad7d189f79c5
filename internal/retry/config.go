package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
)

// Config is one RunInTx call's configuration.
type Config struct {
	MaxAttempts      int           // attempts at most, the first included
	Backoff          Backoff       // the wait before a retry
	LockNotAvailable bool          // retry waits cut by a limit set on purpose (55P03, the SQLite writer lock's timeout)
	CommitCheck      bool          // resolve a COMMIT cut off in flight (Postgres)
	ResolveTimeout   time.Duration // how long the resolution keeps asking the server
}

// Defaults returns RunInTx's configuration when no option changes it: 10
// attempts, a backoff of 5ms doubling up to 1s, the commit check on, and a
// resolution bounded by 10s.
func Defaults() Config {
	return Config{
		MaxAttempts:    10,
		Backoff:        Backoff{Base: 5 * time.Millisecond, Cap: time.Second},
		CommitCheck:    true,
		ResolveTimeout: 10 * time.Second,
	}
}

// Backoff is an exponential backoff with full jitter: the wait after
// attempt n is a random duration between 0 and min(Cap, Base·2^(n-1)), so
// that the attempts that collided do not collide again in step.
type Backoff struct {
	Base, Cap time.Duration // no wait at all when Base <= 0
}

// After returns the wait after the given failed attempt (from 1).
func (b Backoff) After(attempt int) time.Duration {
	if b.Base <= 0 {
		return 0
	}
	limit := b.Cap
	if attempt < 32 {
		if d := b.Base << (attempt - 1); d > 0 && d < limit {
			limit = d
		}
	}
	return rand.N(limit + 1)
}

// Sleep waits d, a backoff's wait, or until ctx ends; it then returns
// ctx's cause.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Transient reports whether err is one that running the whole transaction
// again may not meet: a deadlock (40P01), a serialization failure (40001),
// or SQLite's SQLITE_BUSY (any extended code, SQLITE_BUSY_SNAPSHOT
// included) or SQLITE_LOCKED.
func Transient(err error) bool {
	switch dberr.SQLState(err) {
	case dberr.Deadlock, dberr.SerializationFailure:
		return true
	}
	code, ok := dberr.SQLiteCode(err)
	return ok && (code&0xff == dberr.SQLiteBusy || code&0xff == dberr.SQLiteLocked)
}

// Retryable reports whether an attempt's error is worth another attempt:
// a [Transient] one, lock_not_available (55P03) when c.LockNotAvailable
// says so, a transaction the server ended for idling (25P03), and an
// attempt that cannot have committed anything (see [BeforeCommit]). The
// caller decides the errors of its own locks (the SQLite writer lock's
// timeout) before it asks.
func (c *Config) Retryable(err error) bool {
	if Transient(err) || c.LockNotAvailable && dberr.SQLState(err) == dberr.LockNotAvailable {
		return true
	}
	if dberr.SQLState(err) == dberr.IdleInTransactionTimeout {
		// The server ended the session of a transaction left idle
		// (idle_in_transaction_session_timeout): it aborted, also when the
		// FATAL is what COMMIT met.
		return true
	}
	var ae *attemptError
	return errors.As(err, &ae) && ae.beforeWrite
}

// attemptError marks an attempt's error with where it happened.
type attemptError struct {
	err         error
	beforeWrite bool // nothing can have been committed: the connection broke before COMMIT, or the transaction wrote nothing
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

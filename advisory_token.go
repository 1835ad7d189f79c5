package lockhooks

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Token returns the lock's fencing token: a number that grows with every
// acquisition of the lock's key, so that the data a holder protects can
// refuse a holder whose lock was lost and taken by another meanwhile (a
// paused process, a partitioned replica), which no lock alone can stop.
// Store the token with the data and make every protected write conditional
// on it, in the statement itself:
//
//	UPDATE jobs SET state = $1, fence = $2 WHERE id = $3 AND fence < $2
//
// A write that updates no row came from a holder that was overtaken: stop.
//
// On Postgres the token is a 64-bit transaction id (pg_current_xact_id())
// taken while the lock is held, right after it was granted (through a
// transaction pooler, on another server connection, so the holder's open
// transaction never gets one). Transaction ids are assigned in increasing
// order across the whole cluster and never wrap (the epoch-extended xid8 of
// Postgres 13), so an acquisition's token is larger than the token of any
// acquisition of the same key that released it before, in any process. The
// cost: one round trip and one transaction id per acquisition. On SQLite,
// where the lock is in-process, the token grows with each acquisition in
// the process and starts from the clock (nanoseconds since 1970), so that
// it also grows across restarts unless the clock goes back.
func (l *AdvisoryLock) Token() int64 { return l.token }

// readToken takes the fencing token of a lock that was just granted. The
// lock is held: a context that ends now must not close the connection
// (which would lose it) nor fail the acquisition, so the read has a bounded
// context of its own.
func (l *AdvisoryLock) readToken(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.connector.opts.lockCheckTimeout)
	defer cancel()
	if err := l.conn.QueryRowContext(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&l.token); err != nil {
		return fmt.Errorf("lockhooks: advisory lock %d: reading its fencing token (pg_current_xact_id(), Postgres 13 or later): %w", l.key, err)
	}
	return nil
}

// tokenClock gives the in-process advisory locks (SQLite) their fencing
// tokens: each larger than the last, and than the clock in nanoseconds.
type tokenClock struct{ last atomic.Int64 }

// next returns a new token.
func (c *tokenClock) next() int64 {
	for {
		last := c.last.Load()
		next := max(last+1, time.Now().UnixNano())
		if c.last.CompareAndSwap(last, next) {
			return next
		}
	}
}

// releaseAfterTokenError releases a lock whose token could not be read, so
// that the failed acquisition leaves nothing held, and returns the error
// for the caller.
func (l *AdvisoryLock) releaseAfterTokenError(ctx context.Context, err error) error {
	if rerr := l.Release(ctx); rerr != nil {
		return fmt.Errorf("%w; releasing the lock afterwards: %w", err, rerr)
	}
	return err
}

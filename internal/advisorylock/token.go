package advisorylock

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgstmt"
)

// tokenQuery reads the fencing token.
const tokenQuery = "SELECT " + pgstmt.FencingToken

// ReadToken takes the fencing token of a lock that was just granted
// (0 if none can be assigned). The lock is held: a context that ends now
// must not close the connection (which would lose it) nor fail the
// acquisition, so the read has a bounded context of its own, and its
// failure leaves the token 0. A failure that broke the connection is the
// lock's loss, which the Hold reports (Hold.OwnRow). The read is the
// holder's last statement until it runs another, so it carries the
// holder's annotation, as the pg_locks read before it did: other
// processes name a parked lock's holder from it.
func (l *Lock[K]) ReadToken(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.DB.CheckTimeout)
	defer cancel()
	if row, err := l.Hold.OwnRow(ctx, tokenQuery); err == nil && len(row) > 0 && row[0] != nil {
		l.Token = pgdriver.AsInt64(row[0])
	}
}

// Clock gives in-process advisory locks (SQLite's) their fencing tokens:
// each larger than the last, and than the clock in nanoseconds, so that
// they also grow across restarts unless the clock goes back. Its zero
// value is ready.
type Clock struct{ last atomic.Int64 }

// Next returns a new token.
func (c *Clock) Next() int64 {
	for {
		last := c.last.Load()
		next := max(last+1, time.Now().UnixNano())
		if c.last.CompareAndSwap(last, next) {
			return next
		}
	}
}

package lockhooks

import (
	"context"

	"github.com/lockhooks/lockhooks/internal/dberr"
)

// The parked connection as its database's monitor asks it
// (pgsession.Member): whether it still answers, and what pg_locks says it
// holds.

// Answers reports whether the parked connection c still answers a
// statement of lockhooks' own (a read, on whatever backend a pooler gives
// it); one whose connection broke (a reset, or silence past the check
// timeout) is lost with that cause. It changes nothing of c's tracking
// otherwise.
func (c *conn) Answers(ctx context.Context) bool {
	return c.onParked(ctx, func(ctx context.Context) error { return c.execOwn(ctx, "SELECT 1") })
}

// VerifyParked reads pg_locks on the parked connection c: a connection
// that fails is lost, one that works makes the tracking true.
func (c *conn) VerifyParked(ctx context.Context) {
	c.onParked(ctx, func(ctx context.Context) error { return c.reconcile(ctx, "unknown", nil, false) })
}

// onParked runs run, lockhooks' own statements, on the parked connection c
// under its exec lock and bounded by the check timeout, unless c was closed
// meanwhile; a failure because the connection broke loses c's locks with
// that cause. It reports whether run ran and succeeded.
func (c *conn) onParked(ctx context.Context, run func(context.Context) error) bool {
	c.pin.Exec.Lock()
	defer c.pin.Exec.Unlock()
	c.pin.Lock()
	closed := c.pin.Closed
	c.pin.Unlock()
	if closed {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, c.connector.opts.lockCheckTimeout)
	defer cancel()
	if err := run(ctx); err != nil {
		if !dberr.FromServer(err) || c.connectionBroken(err) {
			c.loseLocks(err)
		}
		return false
	}
	return true
}

package lockhooks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// rerouteUnlock releases k on the parked connection that holds it, for an
// unlock sent on from, which does not hold it. The unlock runs with a
// bounded context of its own: the caller's deadline must not cut a
// statement on the holder, which would make the driver close it and lose
// every other lock it holds.
func (p *pinning) rerouteUnlock(ctx context.Context, from *conn, k lockKey) (err error) {
	defer func() { p.c.noteUnlock(from, k, err) }()
	if err := ctx.Err(); err != nil {
		return err
	}
	h, ok := p.HolderOf(k, from)
	if !ok {
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v: no connection of this database holds that lock (Postgres would answer false); unlock only what you locked, with the same key and mode",
			ErrNotLockOwner, pgsession.SharedSuffix(k), k, from)
	}
	parked, site, since := h.pin.ParkedHold(k)
	if !parked {
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v: the lock is held by %v, which is in use (taken at %s, %v ago); unlock it on that connection (hold a *sql.Conn, or use lockhooks.AcquireAdvisoryLock)",
			ErrNotLockOwner, pgsession.SharedSuffix(k), k, from, h, site, time.Since(since).Round(time.Millisecond))
	}
	defer p.Settle(h) // closes the holder if it holds nothing more
	return h.pin.UnlockParked(context.WithoutCancel(ctx), k, site)
}

// UnlockRerouted counts an unlock rerouted to c.
func (c *conn) UnlockRerouted(ctx context.Context) { c.connector.tel.UnlockRerouted(ctx) }

// noteUnlock records the outcome of an unlock rerouteUnlock handled.
func (c *connector) noteUnlock(from *conn, k lockKey, err error) {
	switch {
	case err == nil:
		c.Events.Add(eventUnlockRerouted, fmt.Sprintf("pg_advisory_unlock%s(%s) sent on %v ran on the parked connection that held the lock", pgsession.SharedSuffix(k), k, from))
	case errors.Is(err, ErrNotLockOwner):
		c.Events.Add(eventUnlockRefused, err.Error())
		c.tel.UnlockRefused(context.Background())
	}
}

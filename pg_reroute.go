package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/rawconn"
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
			ErrNotLockOwner, sharedSuffix(k), k, from)
	}
	h.pin.Lock()
	parked := h.pin.Parked
	l := h.pin.Held[k]
	var site string
	var since time.Time
	if l != nil {
		site, since = l.Site, l.Since
	}
	h.pin.Unlock()
	if !parked {
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v: the lock is held by %v, which is in use (taken at %s, %v ago); unlock it on that connection (hold a *sql.Conn, or use lockhooks.AcquireAdvisoryLock)",
			ErrNotLockOwner, sharedSuffix(k), k, from, h, site, time.Since(since).Round(time.Millisecond))
	}
	defer p.Settle(h) // closes the holder if it holds nothing more
	return h.unlockParked(context.WithoutCancel(ctx), k, site)
}

// unlockParked runs the unlock of k on the parked connection h.
func (h *conn) unlockParked(ctx context.Context, k lockKey, site string) error {
	ctx, cancel := context.WithTimeout(ctx, h.connector.opts.lockCheckTimeout)
	defer cancel()
	h.pin.Exec.Lock()
	defer h.pin.Exec.Unlock()
	h.pin.Lock()
	closed, held := h.pin.Closed, h.pin.Held[k] != nil
	approx := held && h.pin.Held[k].Approx
	h.pin.Unlock()
	if closed || !held {
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s): the parked connection that held it released it meanwhile", ErrNotLockOwner, sharedSuffix(k), k)
	}
	q, args := k.unlockQuery()
	var v driver.Value
	var err error
	if h.connector.opts.txPooler {
		var answer *rawconn.Row
		if answer, err = h.pin.Hold.Run(ctx, q, args); err == nil && len(answer.Values()) == 1 {
			v = answer.Values()[0]
		}
	} else {
		// The unlock is the parked holder's last statement from now on:
		// it names the holder of the locks that stay (pg_identity_publish.go).
		if note, own := h.holderNoteWithout(&k); note != "" {
			q = note + q
			args = append(append([]driver.NamedValue{}, own...), args...)
			for i := range args {
				args[i].Ordinal = i + 1
			}
		}
		v, err = h.queryValue(ctx, q, args...)
	}
	if err != nil {
		if h.ConnectionBroken(err) {
			return pgsession.LostError(h.LoseLocks(err), err)
		}
		return fmt.Errorf("lockhooks: rerouting pg_advisory_unlock%s(%s) to %v: %w", sharedSuffix(k), k, h, err)
	}
	if ok, _ := v.(bool); !ok {
		h.pin.Reconcile(ctx, site, nil, true)
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v, which lockhooks believed held it, returned false", ErrNotLockOwner, sharedSuffix(k), k, h)
	}
	h.connector.tel.UnlockRerouted(ctx)
	h.forgetLock(k)
	h.pin.Hold.EndIfEmpty()
	if approx {
		// The count may be off: pg_locks says whether the key is still held.
		h.pin.Reconcile(ctx, site, nil, false)
	}
	return nil
}

func sharedSuffix(k lockKey) string {
	if k.Shared {
		return "_shared"
	}
	return ""
}

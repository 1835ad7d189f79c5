package pgstmt

import (
	"context"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Kinds of the events the statement path puts among its database's
// recent events (the debug page's).
const (
	EventUnlockRefused = "unlock_refused" // an unlock refused with ErrNotLockOwner
	EventSelfWait      = "self_wait"      // a wait for its own call chain's transaction, failed with ErrSelfWait
)

// checkUnlocks looks at the unlocks of a statement of several calls whose
// keys c does not hold at that point. An unlock inside a larger statement
// cannot be sent to another connection: if another connection of this
// database holds the key, the statement is refused with ErrNotLockOwner
// naming it; if none does, the statement runs as written (Postgres
// answers false for that call, as it would without lockhooks) and a
// warning says so.
func (db *Database[C, K]) checkUnlocks(c C, adv *sqlscan.Advisory, keys []K, site string) error {
	pin := c.Pin()
	pin.Lock()
	unheld := pin.UnheldUnlocksLocked(adv.Calls, keys)
	pin.Unlock()
	for _, k := range unheld {
		if h, ok := db.Sessions.HolderOf(k, c); ok {
			err := fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v, in a statement with other advisory calls: the lock is held by %v, and an unlock inside a larger statement cannot be sent there; unlock it in a statement of its own", pgsession.ErrNotLockOwner, pgsession.SharedSuffix(k), k, c, h)
			db.Events.Add(EventUnlockRefused, err.Error())
			db.Telemetry.UnlockRefused(context.Background())
			return err
		}
		db.Sessions.Settings().Logger.Warn("lockhooks: an unlock of a key this connection does not hold, inside a statement with other advisory calls; Postgres answers false for it",
			"key", k.String(), "connection", c.String(), "at", site)
	}
	return nil
}

// warnSelfWait logs a lock request of c that will wait for a connection
// of this same database parked with the lock: if the same code path took
// it, the request waits for itself.
func (db *Database[C, K]) warnSelfWait(c C, adv *sqlscan.Advisory, keys []K, known []bool, site string) {
	for i, call := range adv.Calls {
		if call.Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 || !known[i] {
			continue
		}
		k := keys[i]
		if c.Pin().Holds(k) {
			continue
		}
		h, ok := db.Sessions.HolderOf(k, c)
		if !ok {
			continue
		}
		hp := h.Pin()
		hp.Lock()
		parked, l := hp.Parked, hp.Held[k]
		var taken string
		if l != nil {
			taken = l.Site
		}
		hp.Unlock()
		if parked && (!advisorykey.Key(k).Shared || hp.Holds(advisorykey.Exclusive(k))) {
			db.Sessions.Settings().Logger.Warn("lockhooks: an advisory lock request waits for a connection of this same database that holds the lock outside the pool; if the same code took it, it waits for itself: unlock it first (pg_advisory_unlock through this database), or take locks with lockhooks.AcquireAdvisoryLock",
				"key", k.String(), "requested_at", site, "holder", h.ID(), "holder_pid", hp.PID.Load(), "taken_at", taken)
		}
	}
}

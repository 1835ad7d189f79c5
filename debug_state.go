package lockhooks

// What the page shows of one database, collected from the model: its held
// locks (pinned, parked, lockset tables, the writer lock), its waiters and
// their holders, the wait graph, and the unlocks it saw.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgblocking"
	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// debugState reads one database's locks, waits, events and counters,
// bounded (see internal/debugpage and debug_collect.go). Locks are read briefly under their own
// mutexes; the one query (who blocks whom, on Postgres) runs after, on the
// database's side connection (pg_blockers.go), shared with overlapping loads.
func (c *connector) debugState(ctx context.Context, index int) debugpage.Database {
	now := time.Now()
	d := debugpage.Database{Index: index, Dialect: string(c.opts.dialect), Pool: c.pool, Held: []debugpage.Held{}, Waiters: []debugpage.Waiter{}}
	conns := c.openConns()
	sort.Slice(conns, func(i, j int) bool { return conns[i].id < conns[j].id })

	// Waits in progress (the oldest debugpage.MaxWaiters in detail), and who
	// holds what they wait for.
	waits, nwaits, waited := c.listWaits(debugpage.MaxWaiters)

	// Held locks: counted by group, the top rows of each kept.
	hc := debugpage.NewCollector(nil, newPageNames())
	c.collectHeld(hc, conns, waited)
	d.Held, d.HeldGroups = hc.Rows(index, now)
	d.HeldTotal = hc.Total()
	if hc.Partial() {
		d.Notes = append(d.Notes, fmt.Sprintf("More than %d locks are held: the page counted the first %d it looked at.", debugpage.ScanLimit, debugpage.ScanLimit))
	}

	edges := c.inProcessEdges()
	var blocked map[*conn]*pgblocking.Wait // by the identity each backend shows (pg_blockers.go)
	if c.opts.dialect == Postgres {
		bctx, cancel := context.WithTimeout(ctx, blockerLookupTimeout)
		var err error
		blocked, err = c.blocking.Blocked(bctx, conns)
		cancel()
		if err != nil {
			d.Notes = append(d.Notes, err.Error())
		}
	}
	shown := map[*conn]bool{}
	for _, v := range waits {
		wt := debugpage.Waiter{Kind: v.Kind, Mode: v.Mode, Scope: v.Scope, Namespace: v.Namespace, Keys: v.Keys,
			Since: v.Start, WaitSeconds: debugpage.SecondsSince(now, v.Start), Site: v.Site, Statement: holders.Truncate(v.Query, 500),
			Holders: c.inProcessHolders(v, edges), Blockers: []holders.Blocker{}}
		if v.Waiter != nil {
			wt.Conn, wt.PID = v.Waiter.id, v.Waiter.pin.PID.Load()
		}
		b := blocked[v.Waiter]
		if ahead := c.turnAhead(v.Waiter); b == nil && ahead != nil && blocked[ahead] != nil {
			b = blocked[ahead].BehindInMemory() // it waits in memory behind a connection that waits on the server
		}
		if v.Waiter != nil && b != nil {
			if b.PID != 0 {
				wt.PID, wt.WaitEvent = b.PID, b.WaitEvent
			}
			found := &holders.Blockage{Holders: wt.Holders, Blockers: wt.Blockers, At: now}
			addBlockers(found, b.Blockers, v.AdvKeys)
			wt.Holders, wt.Blockers, wt.QueuedAhead = found.Holders, found.Blockers, b.QueuedAhead
			shown[v.Waiter] = true
		}
		d.Waiters = append(d.Waiters, wt)
	}
	// Connections the server shows blocked in a statement lockhooks does
	// not time as a lock wait (an UPDATE waiting for a row, say).
	for _, oc := range conns {
		if b := blocked[oc]; b != nil && !shown[oc] {
			nwaits++
			if len(d.Waiters) >= debugpage.MaxWaiters {
				continue
			}
			found := &holders.Blockage{Holders: []holders.Holder{}, Blockers: []holders.Blocker{}, At: now}
			addBlockers(found, b.Blockers, nil)
			w := debugpage.Waiter{Kind: "server", Conn: oc.id, PID: b.PID, Statement: holders.Truncate(b.Query, 500),
				WaitEvent: b.WaitEvent, Holders: found.Holders, Blockers: found.Blockers, QueuedAhead: b.QueuedAhead}
			if b.WaitSeconds >= 0 {
				w.WaitSeconds = math.Round(b.WaitSeconds*1000) / 1000
				w.Since = now.Add(-time.Duration(b.WaitSeconds * float64(time.Second)))
			}
			d.Waiters = append(d.Waiters, w)
		}
	}
	d.WaitersTotal = nwaits
	pids := make(map[uint64]int32, len(conns))
	for _, oc := range conns {
		pids[oc.id] = oc.pin.PID.Load()
	}
	d.Graph = debugpage.GraphOf(d.Waiters, pids, c.pool)

	// Events and counters.
	d.Events, d.Counters = c.events.Snapshot()
	waitsStarted, waitedAll := c.waits.Counts()
	d.Counters["waits_started"] = waitsStarted
	d.Counters["waits_in_progress"] = int64(nwaits)
	d.Counters["wait_milliseconds_total"] = int64(waitedAll / time.Millisecond)
	d.Counters["open_connections"] = int64(len(conns))
	if c.pins != nil {
		held, parked := c.pins.Observe()
		d.Counters["held_session_locks"], d.Counters["parked_connections"] = held, parked
	}
	return d
}

// noteUnlock records the outcome of an unlock rerouteUnlock handled.
func (c *connector) noteUnlock(from *conn, k lockKey, err error) {
	switch {
	case err == nil:
		c.events.Add(eventUnlockRerouted, fmt.Sprintf("pg_advisory_unlock%s(%s) sent on %v ran on the parked connection that held the lock", pgsession.SharedSuffix(k), k, from))
	case errors.Is(err, ErrNotLockOwner):
		c.events.Add(eventUnlockRefused, err.Error())
		c.tel.UnlockRefused(context.Background())
	}
}

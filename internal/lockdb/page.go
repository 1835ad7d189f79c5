package lockdb

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgblocking"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// State reads what the page shows of the database, the index-th of the
// page's: its locks, waits, events and counters, bounded (see
// internal/debugpage and page_held.go). Locks are read briefly under their
// own mutexes; the one query (who blocks whom, on Postgres) runs after,
// on the database's side connection, shared with overlapping loads and
// bounded by lookup.
func (db *DB[C, K]) State(ctx context.Context, index int, lookup time.Duration) debugpage.Database {
	now := time.Now()
	d := debugpage.Database{Index: index, Dialect: db.Dialect, Pool: db.Pool, Held: []debugpage.Held{}, Waiters: []debugpage.Waiter{}}
	conns := db.Conns()
	sort.Slice(conns, func(i, j int) bool { return conns[i].ID() < conns[j].ID() })

	// Waits in progress (the oldest debugpage.MaxWaiters in detail), and who
	// holds what they wait for.
	list, nwaits, waited := db.listWaits(debugpage.MaxWaiters)

	// Held locks: counted by group, the top rows of each kept.
	hc := debugpage.NewCollector(nil, db.pageNames())
	db.collectHeld(hc, conns, waited)
	d.Held, d.HeldGroups = hc.Rows(index, now)
	d.HeldTotal = hc.Total()
	if hc.Partial() {
		d.Notes = append(d.Notes, fmt.Sprintf("More than %d locks are held: the page counted the first %d it looked at.", debugpage.ScanLimit, debugpage.ScanLimit))
	}

	edges := db.Edges()
	var blocked map[C]*pgblocking.Wait // by the identity each backend shows
	if db.postgres() {
		bctx, cancel := context.WithTimeout(ctx, lookup)
		var err error
		blocked, err = db.Blocking.Blocked(bctx, conns)
		cancel()
		if err != nil {
			d.Notes = append(d.Notes, err.Error())
		}
	}
	var none C
	shown := map[C]bool{}
	for _, v := range list {
		wt := debugpage.Waiter{Kind: v.Kind, Mode: v.Mode, Scope: v.Scope, Namespace: v.Namespace, Keys: v.Keys,
			Since: v.Start, WaitSeconds: debugpage.SecondsSince(now, v.Start), Site: v.Site, Statement: holders.Truncate(v.Query, 500),
			Holders: db.InProcessHolders(v, edges), Blockers: []holders.Blocker{}}
		if v.Waiter != none {
			wt.Conn, wt.PID = v.Waiter.ID(), v.Waiter.PID()
		}
		b := blocked[v.Waiter]
		if ahead := db.TurnAhead(v.Waiter); b == nil && ahead != none && blocked[ahead] != nil {
			b = blocked[ahead].BehindInMemory() // it waits in memory behind a connection that waits on the server
		}
		if v.Waiter != none && b != nil {
			if b.PID != 0 {
				wt.PID, wt.WaitEvent = b.PID, b.WaitEvent
			}
			found := &holders.Blockage{Holders: wt.Holders, Blockers: wt.Blockers, At: now}
			db.AddBlockers(found, b.Blockers, v.AdvKeys)
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
			db.AddBlockers(found, b.Blockers, nil)
			w := debugpage.Waiter{Kind: "server", Conn: oc.ID(), PID: b.PID, Statement: holders.Truncate(b.Query, 500),
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
		pids[oc.ID()] = oc.PID()
	}
	d.Graph = debugpage.GraphOf(d.Waiters, pids, db.Pool)

	// Events and counters.
	d.Events, d.Counters = db.Events.Snapshot()
	waitsStarted, waitedAll := db.Waits.Counts()
	d.Counters["waits_started"] = waitsStarted
	d.Counters["waits_in_progress"] = int64(nwaits)
	d.Counters["wait_milliseconds_total"] = int64(waitedAll / time.Millisecond)
	d.Counters["open_connections"] = int64(len(conns))
	if db.postgres() {
		held, parked := db.Sessions.Observe()
		d.Counters["held_session_locks"], d.Counters["parked_connections"] = held, parked
	}
	return d
}

// HeldPage is one JSON page of the database's held locks, as q asks.
func (db *DB[C, K]) HeldPage(q *debugpage.Query) debugpage.HeldPage {
	now := time.Now()
	_, _, waited := db.listWaits(0)
	hc := debugpage.NewCollector(q, db.pageNames())
	db.collectHeld(hc, db.Conns(), waited)
	return hc.Page(now)
}

// listWaits returns the first n waits in progress (the oldest; n < 0:
// all), how many there are in all, and how many of them wait for each
// Postgres advisory key (in exclusive mode).
func (db *DB[C, K]) listWaits(n int) ([]waits.View[C, K], int, map[K]int) {
	var keys map[K]int
	out, total := db.Waits.ListBounded(n, func(ks []K) {
		for _, k := range ks {
			if keys == nil {
				keys = map[K]int{}
			}
			keys[advisorykey.Exclusive(k)]++
		}
	})
	return out, total, keys
}

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
	"strconv"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// debugState reads one database's locks, waits, events and counters,
// bounded (see debug_bounds.go). Locks are read briefly under their own
// mutexes; the one query (who blocks whom, on Postgres) runs after, on the
// database's side connection (side_conn.go), shared with overlapping loads.
func (c *connector) debugState(ctx context.Context, index int) debugDatabase {
	now := time.Now()
	d := debugDatabase{Index: index, Dialect: string(c.opts.dialect), Pool: c.pool, Held: []debugHeld{}, Waiters: []debugWaiter{}}
	conns := c.openConns()
	sort.Slice(conns, func(i, j int) bool { return conns[i].id < conns[j].id })
	sym := siteNames{}

	// Waits in progress (the oldest debugMaxWaiters in detail), and who
	// holds what they wait for.
	waits, nwaits, waited := c.waits.listBounded(debugMaxWaiters)

	// Held locks: counted by group, the top rows of each kept.
	hc := newHeldCollector(nil)
	c.collectHeld(hc, conns, waited)
	d.Held, d.HeldGroups = hc.rows(index, now, sym)
	d.HeldTotal = hc.total
	if hc.partial {
		d.Notes = append(d.Notes, fmt.Sprintf("More than %d locks are held: the page counted the first %d it looked at.", debugScanLimit, debugScanLimit))
	}

	edges := c.inProcessEdges()
	var blocked map[*conn]*blockedBackend // by the identity each backend shows (pg_blockers.go)
	if c.opts.dialect == Postgres {
		bctx, cancel := context.WithTimeout(ctx, blockerLookupTimeout)
		var err error
		blocked, err = c.blockedConns(bctx, conns)
		cancel()
		if err != nil {
			d.Notes = append(d.Notes, err.Error())
		}
	}
	shown := map[*conn]bool{}
	for _, v := range waits {
		wt := debugWaiter{Kind: v.kind, Mode: v.mode, Scope: v.scope, Namespace: v.namespace, Keys: v.keys,
			Since: v.start, WaitSeconds: secondsSince(now, v.start), Site: v.site, Statement: truncate(v.query, 500),
			Holders: c.inProcessHolders(v, edges), Blockers: []holders.Blocker{}}
		if v.conn != nil {
			wt.Conn, wt.PID = v.conn.id, v.conn.pid.Load()
		}
		b := blocked[v.conn]
		if ahead := c.turnAhead(v.conn); b == nil && ahead != nil && blocked[ahead] != nil {
			b = blocked[ahead].behindInMemory() // it waits in memory behind a connection that waits on the server
		}
		if v.conn != nil && b != nil {
			if b.pid != 0 {
				wt.PID, wt.WaitEvent = b.pid, b.waitEvent
			}
			found := &blockage{holders: wt.Holders, blockers: wt.Blockers, at: now}
			found.add(b.blockers, v.advKeys)
			wt.Holders, wt.Blockers, wt.QueuedAhead = found.holders, found.blockers, b.queuedAhead
			shown[v.conn] = true
		}
		d.Waiters = append(d.Waiters, wt)
	}
	// Connections the server shows blocked in a statement lockhooks does
	// not time as a lock wait (an UPDATE waiting for a row, say).
	for _, oc := range conns {
		if b := blocked[oc]; b != nil && !shown[oc] {
			nwaits++
			if len(d.Waiters) >= debugMaxWaiters {
				continue
			}
			found := &blockage{holders: []holders.Holder{}, blockers: []holders.Blocker{}, at: now}
			found.add(b.blockers, nil)
			w := debugWaiter{Kind: "server", Conn: oc.id, PID: b.pid, Statement: truncate(b.query, 500),
				WaitEvent: b.waitEvent, Holders: found.holders, Blockers: found.blockers, QueuedAhead: b.queuedAhead}
			if b.waitSeconds >= 0 {
				w.WaitSeconds = math.Round(b.waitSeconds*1000) / 1000
				w.Since = now.Add(-time.Duration(b.waitSeconds * float64(time.Second)))
			}
			d.Waiters = append(d.Waiters, w)
		}
	}
	d.WaitersTotal = nwaits
	d.Graph = buildGraph(d.Waiters, conns, c.pool)

	// Events and counters.
	d.Events, d.Counters = c.events.snapshot()
	d.Counters["waits_started"] = c.waits.started.Load()
	d.Counters["waits_in_progress"] = int64(nwaits)
	d.Counters["wait_milliseconds_total"] = c.waits.waitNS.Load() / int64(time.Millisecond)
	d.Counters["open_connections"] = int64(len(conns))
	if c.pins != nil {
		held, parked := c.pins.observe()
		d.Counters["held_session_locks"], d.Counters["parked_connections"] = held, parked
	}
	return d
}

// collectHeld offers every lock the database holds to hc: Postgres
// advisory keys per connection (a key Lock made shown as Lock's namespace
// and id), SQLite's advisory locks and locksets, and the writer lock.
// waited counts the waits in progress per Postgres advisory key.
func (c *connector) collectHeld(hc *heldCollector, conns []*conn, waited map[lockKey]int) {
	var cand heldCandidate
	if c.pins != nil {
		for _, oc := range conns {
			if hc.full() {
				break
			}
			oc.pin.mu.Lock()
			state := "in use"
			if oc.pin.parked {
				state = "parked"
			}
			pid := oc.lockPID()
			if oc.holderPID.Load() != 0 {
				state += ", pooler holder"
			}
			for k, l := range oc.pin.held {
				cand = heldCandidate{mode: modeOf(k), scope: "session", connID: oc.id, pid: pid, state: state,
					since: l.since, site: l.site, count: l.count, waiters: waited[k.exclusive()]}
				advisoryCandidate(&cand, k.exclusive())
				hc.offer(&cand)
			}
			for k, n := range oc.pin.xact {
				if hc.full() {
					break
				}
				cand = heldCandidate{mode: modeOf(k), scope: "transaction", connID: oc.id, pid: pid, state: state,
					since: oc.pin.xactSince, site: oc.pin.xactSite, pcs: &oc.pin.xactPCs, count: n, waiters: waited[k.exclusive()]}
				advisoryCandidate(&cand, k.exclusive())
				hc.offer(&cand)
			}
			oc.pin.mu.Unlock()
		}
	}
	c.named.eachHeld(func(key int64, e *sqlitelock.Hold[lockTaker]) bool {
		cand = heldCandidate{kind: "advisory", mode: "exclusive", scope: "session", state: "in use", key: lockKey{K1: key}, advisory: true,
			since: e.Since(), pcs: e.Site(), count: e.Count(), waiters: e.Waiters()}
		ownerOf(&cand, e.Owner())
		hc.offer(&cand)
		return !hc.full()
	})
	c.locksets.eachHeld(func(key locksetKey, e *sqlitelock.Hold[lockTaker]) bool {
		cand = heldCandidate{kind: "lockset", mode: "exclusive", scope: "transaction", state: "in use", namespace: key.namespace, cid: key.id,
			since: e.Since(), pcs: e.Site(), count: e.Count(), waiters: e.Waiters()}
		ownerOf(&cand, e.Owner())
		hc.offer(&cand)
		return !hc.full()
	})
	if wh, ok := c.writer.holder(); ok {
		cand = heldCandidate{kind: "sqlite_writer", mode: "exclusive", scope: "transaction", state: "in use",
			since: wh.Since, count: 1, waiters: c.writer.waiting()}
		if wh.Stmt != "" {
			cand.scope, cand.stmt = "statement", wh.Stmt
		} else {
			cand.site = wh.location()
		}
		ownerOf(&cand, wh.Owner)
		hc.offer(&cand)
	}
}

// ownerOf fills the connection of a held lock's owner.
func ownerOf(c *heldCandidate, owner any) {
	if oc := ownerConn(owner); oc != nil {
		c.connID, c.pid = oc.id, oc.pid.Load()
	}
}

func modeOf(k lockKey) string {
	if k.Shared {
		return "shared"
	}
	return "exclusive"
}

func secondsSince(now, t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return math.Round(now.Sub(t).Seconds()*1000) / 1000
}

// holderNodeID names the graph node of a holder that is not a connection
// of the database the graph is of.
func holderNodeID(h holders.Holder) string {
	id := "db-" + h.Database
	if h.Database == "" {
		id = "db#" + strconv.FormatUint(h.DatabaseNumber, 10)
	}
	if h.Process != "" {
		id = "proc-" + h.Process + "-" + id
	}
	return id + "-conn-" + strconv.FormatUint(h.Conn, 10)
}

// buildGraph builds the wait-for graph of the waiters: an edge from each
// waiter to each holder or blocking backend; an edge between connections
// of this process that lies on a cycle is marked. The page draws it
// collapsed (debug_view.go).
func buildGraph(waiters []debugWaiter, conns []*conn, pool string) debugGraph {
	g := debugGraph{Nodes: []debugNode{}, Edges: []debugEdge{}}
	pids := map[uint64]int32{}
	for _, oc := range conns {
		pids[oc.id] = oc.pid.Load()
	}
	index := map[string]int{}
	node := func(id, label, detail string, external bool) string {
		if _, ok := index[id]; !ok {
			index[id] = len(g.Nodes)
			g.Nodes = append(g.Nodes, debugNode{ID: id, Label: label, Detail: detail, External: external})
		}
		return id
	}
	connNode := func(id uint64) string {
		detail := ""
		if pid := pids[id]; pid != 0 {
			detail = "pid " + strconv.Itoa(int(pid))
		}
		return node("conn-"+strconv.FormatUint(id, 10), "conn #"+strconv.FormatUint(id, 10), detail, false)
	}
	seen := map[[2]string]bool{}
	edge := func(from, to, label string) {
		if from == to || seen[[2]string{from, to}] {
			return
		}
		seen[[2]string{from, to}] = true
		g.Edges = append(g.Edges, debugEdge{From: from, To: to, Label: label})
	}
	for _, w := range waiters {
		if w.Conn == 0 {
			continue
		}
		from := connNode(w.Conn)
		what := w.Kind
		switch {
		case w.Namespace != "":
			what += " " + w.Namespace + " / " + w.Keys
		case w.Keys != "":
			what += " " + w.Keys
		}
		for _, h := range w.Holders {
			switch {
			case h.Conn == 0, h.Depth > 1: // unknown, or it blocks a blocker, not this waiter
			case h.Process == "" && (h.Database == "" || h.Database == pool):
				edge(from, connNode(h.Conn), what)
			default: // a connection of another lockhooks database, of this process or another
				id, detail := holderNodeID(h), h.Database
				if detail == "" {
					detail = "database " + strconv.FormatUint(h.DatabaseNumber, 10)
				}
				if h.Process != "" {
					detail += ", process " + h.Process
				}
				if h.PID != 0 {
					detail += ", pid " + strconv.Itoa(int(h.PID))
				}
				edge(from, node(id, "conn #"+strconv.FormatUint(h.Conn, 10), detail, h.Process != ""), what)
			}
		}
		for _, b := range w.Blockers {
			if b.Depth > 1 {
				continue // blocks a blocker, not this waiter
			}
			detail := b.State
			if b.ApplicationName != "" {
				detail = b.ApplicationName
			}
			edge(from, node("pid-"+strconv.Itoa(int(b.PID)), "pid "+strconv.Itoa(int(b.PID)), detail, true), what)
		}
	}
	// An edge u→v lies on a cycle when u is reachable from v.
	adj := map[string][]string{}
	for _, e := range g.Edges {
		adj[e.From] = append(adj[e.From], e.To)
	}
	reaches := func(from, to string) bool {
		seen := map[string]bool{from: true}
		stack := []string{from}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if n == to {
				return true
			}
			for _, m := range adj[n] {
				if !seen[m] {
					seen[m] = true
					stack = append(stack, m)
				}
			}
		}
		return false
	}
	for i := range g.Edges {
		if reaches(g.Edges[i].To, g.Edges[i].From) {
			g.Edges[i].InCycle, g.Cycle = true, true
		}
	}
	return g
}

// noteUnlock records the outcome of an unlock rerouteUnlock handled.
func (c *connector) noteUnlock(from *conn, k lockKey, err error) {
	switch {
	case err == nil:
		c.events.add(eventUnlockRerouted, fmt.Sprintf("pg_advisory_unlock%s(%s) sent on %v ran on the parked connection that held the lock", sharedSuffix(k), k, from))
	case errors.Is(err, ErrNotLockOwner):
		c.events.add(eventUnlockRefused, err.Error())
		c.tel.unlockRefused(context.Background())
	}
}

// held calls fn for each held key, after copying them under the table's
// mutex (call sites are symbolised outside the table's lock).
func (t *lockTable[K]) held(fn func(key K, h holderInfo, count int)) {
	t.core.Held(func(key K, h sqlitelock.Holder[lockTaker], count int) { fn(key, holderInfoOf(&h), count) })
}

// waiterInfo describes one waiter of a lockTable.
type waiterInfo struct {
	owner any
	since time.Time
	site  callsite.Stack
}

// waits calls fn for each waiter and the holder it waits for, after
// copying them under the table's mutex.
func (t *lockTable[K]) waits(fn func(key K, h holderInfo, w waiterInfo)) {
	t.core.Waits(func(key K, h sqlitelock.Holder[lockTaker], w sqlitelock.Waiting) {
		fn(key, holderInfoOf(&h), waiterInfo{owner: w.Owner, since: w.Since, site: w.Site})
	})
}

// waiting returns how many wait for the writer lock.
func (w *writerLock) waiting() int { return w.core.Waiting() }

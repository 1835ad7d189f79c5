package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

// The Postgres side of the model of holders (holders*.go): who blocks whom
// as the server shows it, for the slow-wait log, the wait spans, the
// errors of waits that time out, deadlocks and the debug page. The
// backends pg_blocking_pids names, followed to the root of the chain (A
// holds, C waits for A, B waits behind C: B's holder is A, and C is queued
// ahead of it), in one query on a side connection; the model identifies
// each (holders_blockage.go, identify) by the identity it published (internal/identity)
// or as a connection of this process.

// maxBlockerDepth bounds how far a chain of waits is followed.
const maxBlockerDepth = 8

// maxQueuedListed bounds the backends queued ahead (waiting themselves)
// listed for one wait: in a queue of n waiters on one lock, the last one
// has n-1 ahead of it, and listing them all would make the read, the page
// and every log line grow with the square of the queue. The holders at
// the root are always listed; blockedBackend.queuedAhead counts the rest.
const maxQueuedListed = 10

// blockedBackend is what Postgres says of one of the database's
// connections that waits on the server.
type blockedBackend struct {
	pid         int32  // the backend that waits (through a pooler, not the one the connection met at connect)
	waitEvent   string // wait_event_type/wait_event
	query       string
	waitSeconds float64           // how long its statement has run (it waits in it); -1: unknown
	blockers    []holders.Blocker // by depth: who blocks it, and whom those wait for, to the root (at most maxQueuedListed of them waiting)
	queuedAhead int               // how many backends block it directly while waiting themselves (queued ahead of it), listed or not
}

// serverBackend is one backend of a read of who blocks whom: what
// pg_stat_activity shows of it and whom it waits for.
type serverBackend struct {
	asked    bool // one of the backends the read was asked about
	shown    bool // pg_stat_activity shows it (a prepared transaction has no backend)
	row      holders.Blocker
	query    string  // its statement, for a waiter
	wait     string  // wait_event_type/wait_event
	queryAge float64 // seconds its statement has run; -1: unknown
	blockers []int32 // pg_blocking_pids: the backends that do not wait themselves, then the first maxQueuedListed that do, in the server's order
	queued   int     // how many of its blockers wait themselves
}

// waits reports whether b waits for another backend.
func (b *serverBackend) waits() bool { return len(b.blockers) > 0 }

// blockedConns reads which of conns wait on the server and for whom, in
// one query on the database's side connection (side_conn.go; never a
// pool's). A connection is matched to the backend that runs its statement
// by the identity it published (a transaction through a pooler runs on any
// backend), or, on a connection that publishes none, by the backend pid it
// met at connect, unless a pooler is declared (that backend serves other
// clients) or the backend shows another application_name than the
// connection had (an undeclared pooler gave it to another client).
// Connections that wait for nothing are absent. Reads that overlap share
// one (blockersFlight).
func (c *connector) blockedConns(ctx context.Context, conns []*conn) (map[*conn]*blockedBackend, error) {
	if len(conns) == 0 {
		return nil, nil
	}
	all, err := c.side.sharedRead(ctx, c, conns)
	if err != nil {
		return nil, err
	}
	out := make(map[*conn]*blockedBackend, min(len(conns), len(all)))
	for _, oc := range conns {
		if bb := all[oc]; bb != nil {
			out[oc] = bb
		}
	}
	return out, nil
}

// readBlocked reads, on side, which of conns wait on the server and for
// whom (blockedConns). The query costs time linear in the backends: each
// backend's pg_blocking_pids is evaluated once (a recursive UNION over
// distinct pids, not over paths: a queue of n waiters on one lock has n!
// paths), and only the blockers each backend names are sent, at most
// maxQueuedListed of them waiting; the chains are followed here.
func (c *connector) readBlocked(ctx context.Context, side driver.Conn, conns []*conn) (map[*conn]*blockedBackend, error) {
	pids := []string{"0"}
	for _, oc := range conns {
		if p := oc.pid.Load(); p != 0 {
			pids = append(pids, strconv.Itoa(int(p)))
		}
	}
	d := c.own.Of(side)
	waiters := "SELECT unnest('{" + strings.Join(pids, ",") + "}'::int[])"
	if d.OK() {
		waiters += "\n\tUNION SELECT pid FROM pg_stat_activity WHERE application_name LIKE '" + c.appNamePrefixOfDatabase() + "%'"
	}
	// The planner cannot know how few rows pg_blocking_pids returns: its
	// estimate of the recursive read grows with the backends asked about
	// past jit_above_cost, and compiling the plan then takes longer than
	// running it (300 ms and more, and past the lookup's timeout on a busy
	// server). JIT is off for this read only: SET LOCAL, in a transaction
	// of its own (a failure closes the side connection, which ends it).
	if err := execDirect(ctx, side, "BEGIN"); err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	if err := execDirect(ctx, side, "SET LOCAL jit = off"); err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	backends, order, err := readServerBackends(ctx, side, c, blockersQuery(waiters), d.Args)
	if err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	if err := execDirect(ctx, side, "COMMIT"); err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	x := c.index()
	wanted := map[*conn]bool{}
	for _, oc := range conns {
		wanted[oc] = true
	}
	out := map[*conn]*blockedBackend{}
	byIdentity := map[*conn]bool{} // out[oc] was found by oc's identity, not by its pid at connect
	for _, wpid := range order {
		w := backends[wpid]
		if !w.asked || !w.shown || !w.waits() {
			continue
		}
		oc := c.backendConn(wpid, w.row.ApplicationName, w.query, x, true)
		if oc == nil || !wanted[oc] {
			continue // another client's backend, or a connection not asked about
		}
		identified := identity.ParseAppName(w.row.ApplicationName) != nil
		if bb := out[oc]; bb != nil && (bb.pid == wpid || !identified || byIdentity[oc]) {
			continue // a second backend claims the connection: keep the one found first
		}
		// Its identity shows where it runs now (the pid it met at connect
		// serves another client), or it is the first backend found for it.
		out[oc] = &blockedBackend{pid: wpid, waitEvent: w.wait, query: w.query, waitSeconds: w.queryAge,
			blockers: serverChain(wpid, backends), queuedAhead: w.queued}
		byIdentity[oc] = identified
	}
	return out, nil
}

// readServerBackends runs query (blockersQuery) on side: the backends it
// found by pid, and their pids in order.
func readServerBackends(ctx context.Context, side driver.Conn, c *connector, query string, args []driver.NamedValue) (map[int32]*serverBackend, []int32, error) {
	rows, err := queryDirect(ctx, side, query, args)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	backends := map[int32]*serverBackend{}
	var order []int32 // by pid
	dest := make([]driver.Value, 12)
	for {
		err := rows.Next(dest)
		if err == io.EOF {
			return backends, order, nil
		}
		if err != nil {
			return nil, nil, err
		}
		b := &serverBackend{asked: asBool(dest[1]), shown: asBool(dest[2]), wait: asString(dest[5]), queryAge: asFloat64(dest[8]),
			query: asString(dest[9]), queued: int(asInt64(dest[11]))}
		b.row = holders.Blocker{SeenBy: c, PID: int32(asInt64(dest[0])), ApplicationName: asString(dest[3]), State: asString(dest[4]),
			XactSeconds: asFloat64(dest[6]), StateSeconds: asFloat64(dest[7]), Query: b.query}
		if b.row.XactSeconds >= 0 {
			b.row.XactSeconds = holders.Round3(b.row.XactSeconds)
		}
		for _, f := range strings.Split(asString(dest[10]), ",") {
			if p, err := strconv.ParseInt(f, 10, 32); err == nil {
				b.blockers = append(b.blockers, int32(p))
			}
		}
		backends[b.row.PID] = b
		order = append(order, b.row.PID)
	}
}

// blockersQuery is the read of readBlocked, for the backends the query
// waiters returns.
func blockersQuery(waiters string) string {
	return `WITH RECURSIVE w(pid) AS (
	` + waiters + `
), reach(pid) AS (
	SELECT pid FROM w
	UNION
	SELECT unnest(pg_blocking_pids(r.pid)) FROM reach r
), e AS (
	SELECT pid, pg_blocking_pids(pid) AS bs FROM reach
), edge AS (
	SELECT e.pid, b.pid AS blocker, b.n, b.pid IN (SELECT pid FROM e WHERE cardinality(bs) > 0) AS waiting
	FROM e CROSS JOIN LATERAL unnest(e.bs) WITH ORDINALITY AS b(pid, n)
), ranked AS (
	SELECT pid, blocker, waiting, row_number() OVER (PARTITION BY pid, waiting ORDER BY n) AS nth FROM edge
), kept AS (
	SELECT pid, string_agg(blocker::text, ',' ORDER BY waiting, nth) FILTER (WHERE NOT waiting OR nth <= ` + strconv.Itoa(maxQueuedListed) + `) AS blockers,
		count(*) FILTER (WHERE waiting) AS queued
	FROM ranked GROUP BY pid
)
SELECT r.pid::bigint, r.pid IN (SELECT pid FROM w), a.pid IS NOT NULL, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(a.wait_event_type || '/' || a.wait_event, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1),
	coalesce(extract(epoch FROM clock_timestamp() - a.state_change)::float8, -1),
	coalesce(extract(epoch FROM clock_timestamp() - a.query_start)::float8, -1),
	left(coalesce(a.query, ''), 1000), coalesce(k.blockers, ''), coalesce(k.queued, 0)
FROM reach r LEFT JOIN kept k ON k.pid = r.pid LEFT JOIN pg_stat_activity a ON a.pid = r.pid
ORDER BY 1`
}

// serverChain follows the waits of backend pid, breadth first to
// maxBlockerDepth: the backends that block it (depth 1), those that block
// them, and so on, each once at the depth first met, sorted by depth and
// pid (at one depth, those that do not wait first); the holders at the root all, and at most maxQueuedListed of those
// that wait themselves.
func serverChain(pid int32, backends map[int32]*serverBackend) []holders.Blocker {
	seen := map[int32]bool{pid: true}
	var out []holders.Blocker
	queued := 0
	level := []int32{pid}
	for depth := 1; depth <= maxBlockerDepth && len(level) > 0; depth++ {
		var next []int32
		for _, p := range level {
			for _, bp := range backends[p].blockers {
				b := backends[bp]
				if seen[bp] || b == nil {
					continue // met already, or it appeared after the chains were read
				}
				seen[bp] = true
				next = append(next, bp)
				if !b.shown {
					continue // no backend to show (a prepared transaction); its own blockers still count
				}
				s := b.row
				s.Depth, s.Waiting = depth, b.waits()
				if s.Waiting {
					if queued >= maxQueuedListed {
						continue
					}
					queued++
					if s.State == "active" && b.queryAge >= 0 {
						s.WaitSeconds = holders.Round3(b.queryAge)
					}
				}
				out = append(out, s)
			}
		}
		level = next
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Depth != out[j].Depth {
			return out[i].Depth < out[j].Depth
		}
		if out[i].Waiting != out[j].Waiting {
			return !out[i].Waiting
		}
		return out[i].PID < out[j].PID
	})
	return out
}

// behindInMemory is what a connection that waits in memory behind b's
// connection (for the turn of the key b's connection waits for on the
// server) waits for: the same holders, with b's connection queued ahead
// too.
func (b *blockedBackend) behindInMemory() *blockedBackend {
	x := *b
	x.queuedAhead++
	x.pid, x.waitEvent = 0, "" // it does not wait on the server itself
	return &x
}

// appNamePrefixOfDatabase is how the application_name of every connection
// of this database begins while it publishes its identity.
func (c *connector) appNamePrefixOfDatabase() string {
	return identity.AppNamePrefix + identity.ShortProcessLabel() + "#" + strconv.FormatUint(c.seq, 10) + "."
}

// connIndex is a database's open connections by number, by the backend
// pid each met at connect, and by the backend of the holder connection
// each keeps through a transaction pooler.
type connIndex struct {
	byID            map[uint64]*conn
	byPID, byHolder map[int32]*conn
}

// index returns c's open connections, indexed.
func (c *connector) index() connIndex {
	conns := c.openConns()
	x := connIndex{byID: make(map[uint64]*conn, len(conns)), byPID: make(map[int32]*conn, len(conns)), byHolder: map[int32]*conn{}}
	for _, oc := range conns {
		x.byID[oc.id] = oc
		if p := oc.pid.Load(); p != 0 {
			x.byPID[p] = oc
		}
		if p := oc.holderPID.Load(); p != 0 {
			x.byHolder[p] = oc
		}
	}
	return x
}

// backendConn returns the connection of c whose statements backend pid
// runs, as pg_stat_activity shows the backend (application_name app, last
// statement query), or nil. A backend that shows a lockhooks identity is
// the connection it names (a transaction through a pooler runs on any
// backend); one that shows none is the holder connection a connection
// keeps through a transaction pooler, or the connection that met it at
// connect, unless c declared a transaction pooler (the backend serves
// other clients then) or the backend shows another application_name than
// the connection had (an undeclared pooler gave it to another client). A
// pid is matched only on c's server (byPID: pids are per server).
func (c *connector) backendConn(pid int32, app, query string, x connIndex, byPID bool) *conn {
	if id := identity.Decode(app, query); id != nil {
		if !id.OfThisProcess() || id.Database != c.seq {
			return nil // another process's, or another database's
		}
		return x.byID[id.Conn]
	}
	if !byPID {
		return nil
	}
	if oc := x.byHolder[pid]; oc != nil {
		return oc
	}
	oc := x.byPID[pid]
	if oc == nil || c.opts.txPooler || app != oc.pub.connectApp {
		return nil
	}
	if c.pins != nil && c.pins.poolerSeen() != nil {
		return nil // a transaction-mode pooler seen: the backend a connection met at connect serves other clients, as with a declared one
	}
	return oc
}

func asBool(v driver.Value) bool {
	switch x := v.(type) {
	case bool:
		return x
	case []byte:
		return len(x) > 0 && (x[0] == 't' || x[0] == '1')
	case string:
		return x == "t" || x == "true"
	}
	return false
}

// keyHolders returns the backends other than waiter's that hold the
// advisory keys now, read on the side connection (nil if none or
// unreadable): the holders of a wait that does not wait on the server
// (through a transaction pooler, lockhooks polls with try-locks), or that
// ended before anyone looked.
func (c *connector) keyHolders(ctx context.Context, waiter *conn, keys []lockKey) []holders.Blocker {
	if len(keys) == 0 {
		return nil
	}
	var match []string
	for _, k := range keys {
		classid, objid, sub := advisorykey.Key(k).LocksID()
		m := fmt.Sprintf("(l.classid::bigint = %d AND l.objid::bigint = %d AND l.objsubid = %d", classid, objid, sub)
		if k.Shared {
			m += " AND l.mode = 'ExclusiveLock'" // only exclusive holders block a shared request
		}
		match = append(match, m+")")
	}
	var out []holders.Blocker
	c.side.use(ctx, func(side driver.Conn) error {
		out = nil
		rows, err := queryDirect(ctx, side, `SELECT DISTINCT a.pid::bigint, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1), left(coalesce(a.query, ''), 1000),
	coalesce(extract(epoch FROM clock_timestamp() - a.state_change)::float8, -1)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.pid <> `+strconv.Itoa(int(waiter.shownPID()))+` AND (`+strings.Join(match, " OR ")+`)
ORDER BY 1`, c.own.Of(side).Args)
		if err != nil {
			return err
		}
		defer rows.Close()
		dest := make([]driver.Value, 6)
		for {
			if err := rows.Next(dest); err != nil {
				if err == io.EOF {
					return nil
				}
				out = nil
				return err
			}
			out = append(out, holders.Blocker{SeenBy: c, Depth: 1, PID: int32(asInt64(dest[0])), ApplicationName: asString(dest[1]), State: asString(dest[2]),
				XactSeconds: asFloat64(dest[3]), Query: asString(dest[4]), StateSeconds: asFloat64(dest[5])})
		}
	})
	return out
}

package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The Postgres side of the model of holders (holders.go): who blocks whom
// as the server shows it, for the slow-wait log, the wait spans, the
// errors of waits that time out, deadlocks and the debug page. The
// backends pg_blocking_pids names, followed to the root of the chain (A
// holds, C waits for A, B waits behind C: B's holder is A, and C is queued
// ahead of it), in one query on a side connection; the model identifies
// each (holders.go, identify) by the identity it published (pg_identity.go)
// or as a connection of this process.

// pgBlocker is a Postgres backend that blocks a wait, as pg_blocking_pids
// and pg_stat_activity show it; the model names those that are
// connections of lockhooks databases as holders, and shows the others as
// they are.
type pgBlocker struct {
	PID             int32      `json:"pid"`
	ApplicationName string     `json:"application_name"`
	State           string     `json:"state"`
	XactSeconds     float64    `json:"xact_age_seconds"`       // -1: no transaction
	Query           string     `json:"query"`                  // the statement text; never its arguments
	Depth           int        `json:"depth"`                  // 1: it blocks the waiter; 2: it blocks a backend of depth 1; …
	Waiting         bool       `json:"waiting"`                // it waits itself (queued ahead), so it is not the holder at the root
	WaitSeconds     float64    `json:"wait_seconds,omitempty"` // how long it has waited, when Waiting
	seenBy          *connector // the database whose side connection read it: its pid is a backend of that server
	stateSeconds    float64    // how long its state has been State (pg_stat_activity's state_change; 0 or -1: unknown)
}

// String names a backend nobody identified, for a slow-wait line or an
// error.
func (b pgBlocker) String() string {
	s := fmt.Sprintf("backend pid %d", b.PID)
	if b.ApplicationName != "" {
		s += fmt.Sprintf(" (%q)", b.ApplicationName)
	}
	s += ", " + b.State
	if b.XactSeconds >= 0 {
		s += fmt.Sprintf(", transaction open %.1fs", b.XactSeconds)
	}
	switch {
	case b.Waiting:
		if b.WaitSeconds > 0 {
			s += fmt.Sprintf(", waiting %.1fs", b.WaitSeconds)
		}
		if b.Query != "" {
			s += fmt.Sprintf(" in %.120q", b.Query)
		}
	case b.Query != "":
		s += fmt.Sprintf(", last statement %.120q", b.Query)
	}
	return s
}

// aged is b d seconds later.
func (b pgBlocker) aged(d float64) pgBlocker {
	if b.XactSeconds >= 0 {
		b.XactSeconds = round3(b.XactSeconds + d)
	}
	if b.WaitSeconds > 0 {
		b.WaitSeconds = round3(b.WaitSeconds + d)
	}
	return b
}

// maxBlockerDepth bounds how far a chain of waits is followed.
const maxBlockerDepth = 8

// blockedBackend is what Postgres says of one of the database's
// connections that waits on the server.
type blockedBackend struct {
	pid         int32  // the backend that waits (through a pooler, not the one the connection met at connect)
	waitEvent   string // wait_event_type/wait_event
	query       string
	waitSeconds float64     // how long its statement has run (it waits in it); -1: unknown
	blockers    []pgBlocker // by depth: who blocks it, and whom those wait for, to the root
}

// blockedConns reads, on a side connection of its own (never a pool's),
// which of conns wait on the server and for whom. A connection is matched
// to the backend that runs its statement by the identity it published (a
// transaction through a pooler runs on any backend), or, on a connection
// that publishes none, by the backend pid it met at connect, unless a
// pooler is declared (that backend serves other clients) or the backend
// shows another application_name than the connection had (an undeclared
// pooler gave it to another client). Connections that wait for nothing are
// absent.
func (c *connector) blockedConns(ctx context.Context, conns []*conn) (map[*conn]*blockedBackend, error) {
	var pids []string
	for _, oc := range conns {
		if p := oc.pid.Load(); p != 0 {
			pids = append(pids, strconv.Itoa(int(p)))
		}
	}
	if len(conns) == 0 {
		return nil, nil
	}
	side, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("lockhooks: connecting to read pg_blocking_pids: %w", err)
	}
	defer side.Close()
	d := c.own.of(side)
	waiters := "SELECT unnest('{" + strings.Join(pids, ",") + "}'::int[])"
	if d.ok() {
		waiters += "\n\tUNION SELECT pid FROM pg_stat_activity WHERE application_name LIKE '" + c.appNamePrefixOfDatabase() + "%'"
	}
	rows, err := queryDirect(ctx, side, `WITH RECURSIVE w(pid) AS (
	`+waiters+`
), chain(waiter, pid, depth, path) AS (
	SELECT w.pid, b.pid, 1, ARRAY[w.pid, b.pid] FROM w CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid)
	UNION ALL
	SELECT c.waiter, b.pid, c.depth + 1, c.path || b.pid FROM chain c CROSS JOIN LATERAL unnest(pg_blocking_pids(c.pid)) AS b(pid)
	WHERE b.pid <> ALL (c.path) AND c.depth < `+strconv.Itoa(maxBlockerDepth)+`
)
SELECT c.waiter::bigint, coalesce(wa.application_name, ''), coalesce(wa.wait_event_type || '/' || wa.wait_event, ''), left(coalesce(wa.query, ''), 1000),
	c.depth, c.pid::bigint, cardinality(pg_blocking_pids(c.pid)) > 0, coalesce(b.application_name, ''), coalesce(b.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - b.xact_start)::float8, -1),
	coalesce(extract(epoch FROM clock_timestamp() - b.state_change)::float8, -1),
	coalesce(extract(epoch FROM clock_timestamp() - b.query_start)::float8, -1),
	left(coalesce(b.query, ''), 1000), coalesce(extract(epoch FROM clock_timestamp() - wa.query_start)::float8, -1)
FROM chain c JOIN pg_stat_activity b ON b.pid = c.pid LEFT JOIN pg_stat_activity wa ON wa.pid = c.waiter
ORDER BY 1, 5, 6`, d.args)
	if err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	defer rows.Close()
	x := c.index()
	wanted := map[*conn]bool{}
	for _, oc := range conns {
		wanted[oc] = true
	}
	out := map[*conn]*blockedBackend{}
	byIdentity := map[*conn]bool{} // out[oc] was found by oc's identity, not by its pid at connect
	seen := map[[2]int32]bool{}
	dest := make([]driver.Value, 14)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
		}
		wpid, wapp := int32(asInt64(dest[0])), asString(dest[1])
		oc := c.backendConn(wpid, wapp, asString(dest[3]), x, true)
		if oc == nil || !wanted[oc] {
			continue // another client's backend, or a connection not asked about
		}
		identified := parseAppName(wapp) != nil
		bb := out[oc]
		if bb != nil && bb.pid != wpid && identified && !byIdentity[oc] {
			bb = nil // its identity shows where it runs now; the pid it met at connect serves another client
		}
		if bb == nil {
			bb = &blockedBackend{pid: wpid, waitEvent: asString(dest[2]), query: asString(dest[3]), waitSeconds: asFloat64(dest[13])}
			out[oc], byIdentity[oc] = bb, identified
		}
		if bb.pid != wpid {
			continue // a second backend claims the connection: keep the one found first
		}
		b := pgBlocker{seenBy: c, Depth: int(asInt64(dest[4])), PID: int32(asInt64(dest[5])), Waiting: asBool(dest[6]),
			ApplicationName: asString(dest[7]), State: asString(dest[8]), XactSeconds: asFloat64(dest[9]), stateSeconds: asFloat64(dest[10]), Query: asString(dest[12])}
		if seen[[2]int32{wpid, b.PID}] {
			continue // met again deeper in the chain
		}
		seen[[2]int32{wpid, b.PID}] = true
		if queryAge := asFloat64(dest[11]); b.Waiting && b.State == "active" && queryAge >= 0 {
			b.WaitSeconds = round3(queryAge)
		}
		if b.XactSeconds >= 0 {
			b.XactSeconds = round3(b.XactSeconds)
		}
		bb.blockers = append(bb.blockers, b)
	}
}

// appNamePrefixOfDatabase is how the application_name of every connection
// of this database begins while it publishes its identity.
func (c *connector) appNamePrefixOfDatabase() string {
	return appNamePrefix + shortProcess(processLabel(), appNameProcessLen) + "#" + strconv.FormatUint(c.seq, 10) + "."
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
	if id := decodeIdentity(app, query); id != nil {
		if !id.ofThisProcess() || id.Database != c.seq {
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

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// keyHolders returns the backends other than waiter's that hold the
// advisory keys now, read on a side connection (nil if none or
// unreadable): the holders of a wait that does not wait on the server
// (through a transaction pooler, lockhooks polls with try-locks), or that
// ended before anyone looked.
func (c *connector) keyHolders(ctx context.Context, waiter *conn, keys []lockKey) []pgBlocker {
	if len(keys) == 0 {
		return nil
	}
	var match []string
	for _, k := range keys {
		classid, objid, sub := k.pgLocksID()
		m := fmt.Sprintf("(l.classid::bigint = %d AND l.objid::bigint = %d AND l.objsubid = %d", classid, objid, sub)
		if k.shared {
			m += " AND l.mode = 'ExclusiveLock'" // only exclusive holders block a shared request
		}
		match = append(match, m+")")
	}
	side, err := c.inner.Connect(ctx)
	if err != nil {
		return nil
	}
	defer side.Close()
	rows, err := queryDirect(ctx, side, `SELECT DISTINCT a.pid::bigint, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1), left(coalesce(a.query, ''), 1000),
	coalesce(extract(epoch FROM clock_timestamp() - a.state_change)::float8, -1)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.pid <> `+strconv.Itoa(int(waiter.shownPID()))+` AND (`+strings.Join(match, " OR ")+`)
ORDER BY 1`, c.own.of(side).args)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []pgBlocker
	dest := make([]driver.Value, 6)
	for rows.Next(dest) == nil {
		out = append(out, pgBlocker{seenBy: c, Depth: 1, PID: int32(asInt64(dest[0])), ApplicationName: asString(dest[1]), State: asString(dest[2]),
			XactSeconds: asFloat64(dest[3]), Query: asString(dest[4]), stateSeconds: asFloat64(dest[5])})
	}
	return out
}

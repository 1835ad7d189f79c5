package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Reading who blocks whom on Postgres, for the slow-wait log, the wait
// spans, the errors of waits that time out and the debug page: the backends
// pg_blocking_pids names, followed to the root of the chain (A holds, C
// waits for A, B waits behind C: B's holder is A, and C is queued ahead of
// it), each named by the identity it published (pg_identity.go), all in
// one query on a side connection.

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
	byPID, byID := c.connIndex()
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
		oc := c.ownerOf(wpid, wapp, byPID, byID)
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
		b := pgBlocker{Depth: int(asInt64(dest[4])), PID: int32(asInt64(dest[5])), Waiting: asBool(dest[6]),
			ApplicationName: asString(dest[7]), State: asString(dest[8]), XactSeconds: asFloat64(dest[9]), Query: asString(dest[12])}
		if seen[[2]int32{wpid, b.PID}] {
			continue // met again deeper in the chain
		}
		seen[[2]int32{wpid, b.PID}] = true
		if h := c.ownerOf(b.PID, b.ApplicationName, byPID, byID); h != nil {
			b.Conn = h.id
		}
		b.Holder = decodeIdentity(b.ApplicationName, b.Query)
		stateAge, queryAge := asFloat64(dest[10]), asFloat64(dest[11])
		switch {
		case b.Waiting:
			if b.State == "active" && queryAge >= 0 {
				b.WaitSeconds = round3(queryAge)
			}
		case b.Holder != nil && !b.Holder.Since.IsZero() && b.Holder.Holds != "tx":
			b.HeldSeconds = round3(time.Since(b.Holder.Since).Seconds())
		case b.XactSeconds >= 0:
			b.HeldSeconds = round3(b.XactSeconds)
		case parseAnnotation(b.Query) != nil && stateAge >= 0:
			// Idle since lockhooks' own read that followed the lock.
			b.HeldSeconds = round3(stateAge)
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

// ownerOf returns the connection of this database that backend pid, showing
// appName, is running the statements of; nil if none is.
func (c *connector) ownerOf(pid int32, appName string, byPID map[int32]*conn, byID map[uint64]*conn) *conn {
	if id := parseAppName(appName); id != nil {
		if id.Process != shortProcess(processLabel(), appNameProcessLen) || id.Database != c.seq {
			return nil // another process's, or another database's
		}
		return byID[id.Conn]
	}
	oc := byPID[pid]
	if oc == nil || c.opts.txPooler || appName != oc.pub.connectApp {
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

// describe names one blocker for a slow-wait line or an error.
func (b pgBlocker) describe() string {
	var s string
	switch {
	case b.Holder != nil && b.Waiting:
		s = b.Holder.describe(b.PID, 0)
	case b.Holder != nil:
		s = b.Holder.describe(b.PID, time.Duration(b.HeldSeconds*float64(time.Second)))
	default:
		s = fmt.Sprintf("backend pid %d", b.PID)
		if b.ApplicationName != "" {
			s += fmt.Sprintf(" (%q)", b.ApplicationName)
		}
		s += ", " + b.State
		if b.XactSeconds >= 0 {
			s += fmt.Sprintf(", transaction open %.1fs", b.XactSeconds)
		}
	}
	if b.Conn != 0 {
		s += fmt.Sprintf(" = connection #%d of this database", b.Conn)
	}
	if b.Waiting {
		if b.WaitSeconds > 0 {
			s += fmt.Sprintf(", waiting %.1fs", b.WaitSeconds)
		}
		if b.Query != "" {
			s += fmt.Sprintf(" in %.120q", b.Query)
		}
	} else if b.Query != "" && parseAnnotation(b.Query) == nil {
		s += fmt.Sprintf(", last statement %.120q", b.Query)
	}
	return s
}

// describeBlockers is the Postgres part of a slow-wait line: the holders
// at the root of the chain, then the backends queued ahead that wait for
// them too; skip leaves out blockers already named as in-process holders.
func describeBlockers(bs []pgBlocker, skip func(pgBlocker) bool) []string {
	var parts, queued []string
	for _, b := range bs {
		if skip != nil && skip(b) {
			continue
		}
		if b.Waiting {
			queued = append(queued, b.describe())
		} else {
			parts = append(parts, b.describe())
		}
	}
	if len(queued) > 0 {
		parts = append(parts, "queued ahead of this wait, waiting too: "+strings.Join(queued, "; "))
	}
	return parts
}

// rootHolder returns the first holder at the root of bs that published an
// identity, or the first root.
func rootHolder(bs []pgBlocker) (pgBlocker, bool) {
	var first *pgBlocker
	for i := range bs {
		if bs[i].Waiting {
			continue
		}
		if bs[i].Holder != nil {
			return bs[i], true
		}
		if first == nil {
			first = &bs[i]
		}
	}
	if first != nil {
		return *first, true
	}
	return pgBlocker{}, false
}

// remoteHolderArgs are the slow-wait line's attributes of the holder
// at the root of bs, when no in-process holder was named.
func remoteHolderArgs(bs []pgBlocker) []any {
	b, ok := rootHolder(bs)
	if !ok {
		return nil
	}
	args := []any{"holder_pid", b.PID}
	if b.Holder != nil {
		args = append(args, "holder_process", b.Holder.Process, "holder_connection", b.Holder.Conn)
		if b.Holder.Site != "" {
			args = append(args, "holder_site", b.Holder.Site)
		}
		if b.Holder.TraceID != "" {
			args = append(args, "holder_trace", b.Holder.TraceID)
		}
	}
	if b.HeldSeconds > 0 {
		args = append(args, "holder_age", (time.Duration(b.HeldSeconds * float64(time.Second))).Round(time.Millisecond).String())
	}
	var queued []string
	for _, x := range bs {
		if x.Waiting {
			queued = append(queued, strconv.Itoa(int(x.PID)))
		}
	}
	if len(queued) > 0 {
		args = append(args, "queued_pids", strings.Join(queued, ","))
	}
	return args
}

// nameRemoteHolder completes the error of a lock wait that timed out, was
// cancelled or found the lock taken (55P03) with who held the lock: the
// holder the wait's slow-wait line or span last read, or, for advisory
// keys, the backends pg_locks shows holding them now.
func (c *conn) nameRemoteHolder(plan advisoryPlan, err error) error {
	w := plan.wait
	if err == nil || w == nil || c.connector.opts.dialect != Postgres {
		return err
	}
	switch o := outcomeOf(err); {
	case o == outcomeTimeout, o == outcomeCanceled, sqlState(err) == "55P03":
	default:
		return err
	}
	var desc string
	if seen := w.remote.Load(); seen != nil {
		desc = strings.Join(describeBlockers(seen.aged(), nil), "; ")
	}
	if desc == "" && plan.st.advisory != nil {
		var keys []lockKey
		for i, call := range plan.st.advisory.Calls {
			if plan.known[i] && call.Func&(sqlscan.FnUnlock|sqlscan.FnUnlockAll) == 0 {
				keys = append(keys, plan.keys[i])
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
		desc = strings.Join(describeBlockers(c.connector.keyHolders(ctx, c, keys), nil), "; ")
		cancel()
	}
	if desc == "" {
		return err
	}
	return fmt.Errorf("%w; lockhooks: it waited %v for the lock held by %s", err, time.Since(w.start).Round(time.Millisecond), desc)
}

// remoteSeen is what a wait's blockers read found, and when.
type remoteSeen struct {
	at       time.Time
	blockers []pgBlocker
}

// aged returns the blockers with their ages brought up to now.
func (r *remoteSeen) aged() []pgBlocker {
	d := round3(time.Since(r.at).Seconds())
	out := make([]pgBlocker, len(r.blockers))
	for i, b := range r.blockers {
		if b.HeldSeconds > 0 {
			b.HeldSeconds += d
		}
		if b.WaitSeconds > 0 {
			b.WaitSeconds += d
		}
		if b.XactSeconds >= 0 {
			b.XactSeconds += d
		}
		out[i] = b
	}
	return out
}

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
		classid, objid, sub := uint32(uint64(k.k1)>>32), uint32(k.k1), 1
		if k.pair {
			classid, objid, sub = uint32(int32(k.k1)), uint32(int32(k.k2)), 2
		}
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
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1),
	coalesce(extract(epoch FROM clock_timestamp() - a.state_change)::float8, -1), left(coalesce(a.query, ''), 1000)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.pid <> `+strconv.Itoa(int(waiter.lockPID()))+` AND (`+strings.Join(match, " OR ")+`)
ORDER BY 1`, c.own.of(side).args)
	if err != nil {
		return nil
	}
	defer rows.Close()
	byPID, byID := c.connIndex()
	var out []pgBlocker
	dest := make([]driver.Value, 6)
	for rows.Next(dest) == nil {
		b := pgBlocker{Depth: 1, PID: int32(asInt64(dest[0])), ApplicationName: asString(dest[1]), State: asString(dest[2]),
			XactSeconds: asFloat64(dest[3]), Query: asString(dest[5])}
		b.Holder = decodeIdentity(b.ApplicationName, b.Query)
		if h := c.ownerOf(b.PID, b.ApplicationName, byPID, byID); h != nil {
			b.Conn = h.id
		}
		switch {
		case b.Holder != nil && !b.Holder.Since.IsZero() && b.Holder.Holds != "tx":
			b.HeldSeconds = round3(time.Since(b.Holder.Since).Seconds())
		case parseAnnotation(b.Query) != nil:
			b.HeldSeconds = round3(asFloat64(dest[4]))
		case b.XactSeconds >= 0:
			b.HeldSeconds = round3(b.XactSeconds)
		}
		out = append(out, b)
	}
	return out
}

// connIndex returns the database's open connections by backend pid (met at
// connect) and by number.
func (c *connector) connIndex() (byPID map[int32]*conn, byID map[uint64]*conn) {
	byPID, byID = map[int32]*conn{}, map[uint64]*conn{}
	for _, oc := range c.openConns() {
		if p := oc.pid.Load(); p != 0 {
			byPID[p] = oc
		}
		byID[oc.id] = oc
	}
	return byPID, byID
}

// spanBlockers is what a wait span records of its blockers.
type spanBlockers struct {
	event     []attribute.KeyValue // the lockhooks.lock.blockers event: the backends that block the wait directly
	holder    []attribute.KeyValue // the span's attributes naming the holder at the root
	link      trace.Link           // to the holder's span, when its process published one
	blockers  []pgBlocker          // what was read
	inProcess []holder             // the blockers that are connections of lockhooks databases of this process
}

// blockers reads who blocks wc's statement, for its wait span.
func (c *connector) blockers(ctx context.Context, wc *conn, w *lockWait, keys []lockKey) (spanBlockers, error) {
	var sb spanBlockers
	blocked, err := c.blockedConns(ctx, []*conn{wc})
	if err != nil {
		return sb, err
	}
	b := blocked[wc]
	if b == nil {
		b = &blockedBackend{pid: wc.pid.Load()}
		if ww := w.t.watch; ww != nil {
			// Not waiting on the server (through a transaction pooler
			// lockhooks polls): the holders of its advisory keys.
			ww.mu.Lock()
			keys := w.advKeys
			ww.mu.Unlock()
			b.blockers = c.keyHolders(ctx, wc, keys)
		}
	}
	sb.inProcess, _ = resolveBlockers(nil, b.blockers, keys)
	var pids []int64
	var states, starts, queries, apps []string
	now := time.Now()
	for _, x := range b.blockers {
		if x.Depth > 1 {
			continue
		}
		start := ""
		if x.XactSeconds >= 0 {
			start = now.Add(-time.Duration(x.XactSeconds * float64(time.Second))).UTC().Format(time.RFC3339Nano)
		}
		pids, states, starts = append(pids, int64(x.PID)), append(states, x.State), append(starts, start)
		queries, apps = append(queries, truncate(x.Query, 200)), append(apps, x.ApplicationName)
	}
	sb.event = []attribute.KeyValue{
		AttrBackendPID.Int64(int64(b.pid)),
		attribute.Int64Slice("lockhooks.blocker.backend_pids", pids),
		attribute.StringSlice("lockhooks.blocker.states", states),
		attribute.StringSlice("lockhooks.blocker.xact_starts", starts),
		attribute.StringSlice("lockhooks.blocker.queries", queries),
		attribute.StringSlice("lockhooks.blocker.application_names", apps),
	}
	var queued []int64
	for _, x := range b.blockers {
		if x.Waiting {
			queued = append(queued, int64(x.PID))
		}
	}
	if len(queued) > 0 {
		sb.event = append(sb.event, attribute.Int64Slice("lockhooks.blocker.queued_pids", queued))
	}
	root, ok := rootHolder(b.blockers)
	if !ok {
		return sb, nil
	}
	sb.blockers = b.blockers
	sb.event = append(sb.event, attribute.Int64("lockhooks.blocker.root_pid", int64(root.PID)))
	sb.holder = []attribute.KeyValue{AttrHolderPID.Int64(int64(root.PID)), AttrHolderDescription.String(root.describe())}
	if root.HeldSeconds > 0 {
		sb.holder = append(sb.holder, AttrHolderHeldSeconds.Float64(root.HeldSeconds))
	}
	if id := root.Holder; id != nil {
		sb.holder = append(sb.holder, AttrHolderProcess.String(id.Process), AttrHolderConnection.Int64(int64(id.Conn)))
		if id.Site != "" {
			sb.holder = append(sb.holder, AttrHolderSite.String(id.Site))
		}
		if !id.Since.IsZero() && id.Holds != "tx" {
			sb.holder = append(sb.holder, AttrHolderSince.String(id.Since.UTC().Format(time.RFC3339Nano)))
		}
		if sc := id.spanContext(); sc.IsValid() {
			sb.link = trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
				AttrHolderProcess.String(id.Process), AttrHolderPID.Int64(int64(root.PID)), AttrHolderSite.String(id.Site)}}
		}
	}
	return sb, nil
}

// Attributes of a wait span naming a holder in another process.
const (
	AttrHolderProcess     = attribute.Key("lockhooks.holder.process")      // host/pid of the holder's process
	AttrHolderConnection  = attribute.Key("lockhooks.holder.connection")   // the holder's connection number in its database
	AttrHolderHeldSeconds = attribute.Key("lockhooks.holder.held_seconds") // how long it has held, as far as known
	AttrHolderDescription = attribute.Key("lockhooks.holder.description")  // the holder as the slow-wait line names it
)

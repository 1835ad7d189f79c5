package lockhooks

import (
	"context"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// ErrLockLost is wrapped by the errors that report a lock whose connection
// died (terminated backend, broken network, a cancelled statement that made
// the driver close the connection). The work the lock protected must stop:
// other processes may hold the lock now.
var ErrLockLost = errors.New("lockhooks: lock lost")

// ErrNotLockOwner is wrapped by the error returned, instead of Postgres's
// silent false, for a pg_advisory_unlock that cannot be honoured: no
// connection of this database holds the key, or the one that does is in
// use elsewhere.
var ErrNotLockOwner = errors.New("lockhooks: not the lock's owner")

// LockID returns the advisory-lock key for name: the last 8 bytes of its
// SHA-256, big-endian, with the top bit cleared, the same as dstack's
// string_to_lock_id.
func LockID(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[24:]) & (1<<63 - 1))
}

// lockKey identifies one session advisory lock: a bigint key or a pair of
// int4 keys (separate key spaces), in exclusive or shared mode.
type lockKey struct {
	pair   bool
	k1     int64 // the bigint key, or the first int4 key
	k2     int64 // the second int4 key
	shared bool
}

func (k lockKey) String() string {
	s := strconv.FormatInt(k.k1, 10)
	if k.pair {
		s = "(" + s + ", " + strconv.FormatInt(k.k2, 10) + ")"
	}
	if k.shared {
		s += " (shared)"
	}
	return s
}

// unlockQuery returns the statement that releases k once.
func (k lockKey) unlockQuery() (string, []driver.NamedValue) {
	fn := "pg_advisory_unlock"
	if k.shared {
		fn += "_shared"
	}
	if k.pair {
		return "SELECT " + fn + "($1::int4, $2::int4)", []driver.NamedValue{{Ordinal: 1, Value: k.k1}, {Ordinal: 2, Value: k.k2}}
	}
	return "SELECT " + fn + "($1::bigint)", []driver.NamedValue{{Ordinal: 1, Value: k.k1}}
}

// heldLock is one key a connection holds.
type heldLock struct {
	count int
	since time.Time
	site  string            // where it was taken: file:line
	span  trace.SpanContext // the span of the statement that took it
}

// pinState is what a connection knows of its session advisory locks.
type pinState struct {
	active atomic.Bool // the connection holds locks or lost them: statements take the slow path

	mu       sync.Mutex
	held     map[lockKey]*heldLock
	parked   bool
	parkedAt time.Time
	warned   bool
	lost     error         // non-nil once the locks are known lost
	lostCh   chan struct{} // closed when lost is set
	gen      uint64        // changes whenever held may have changed
	busy     int           // advisory statements in flight
	recheck  bool          // reconcile with pg_locks once the transaction ends

	// exec serialises statements the wrapper itself runs on a parked
	// connection (rerouted unlocks).
	exec sync.Mutex
}

// callSiteKey carries the user's call site into the hooks.
type callSiteKey struct{}

// callers is a captured call stack, symbolised only when printed, so that
// recording where a lock was taken costs no allocation.
type callers struct {
	pcs [16]uintptr
	n   int
}

// capture records the current call stack.
func (c *callers) capture() { c.n = runtime.Callers(3, c.pcs[:]) }

// String returns file:line of the first frame outside database/sql and
// lockhooks itself.
func (c *callers) String() string {
	if c.n == 0 {
		return "unknown"
	}
	frames := runtime.CallersFrames(c.pcs[:c.n])
	for {
		f, more := frames.Next()
		internal := strings.HasPrefix(f.Function, "database/sql.") ||
			(strings.HasPrefix(f.Function, "github.com/lockhooks/lockhooks.") && !strings.HasSuffix(f.File, "_test.go"))
		if !internal && f.Function != "" && !strings.HasPrefix(f.Function, "runtime.") {
			return shortFile(f.File) + ":" + strconv.Itoa(f.Line)
		}
		if !more {
			return "unknown"
		}
	}
}

// callSite returns file:line of the first caller outside database/sql and
// lockhooks itself.
func callSite() string {
	var c callers
	c.capture()
	return c.String()
}

// shortFile keeps the last two elements of a path.
func shortFile(path string) string {
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		if j := strings.LastIndexByte(path[:i], '/'); j >= 0 {
			return path[j+1:]
		}
	}
	return path
}

// siteOf returns the call site recorded in ctx, or finds it.
func siteOf(ctx context.Context) string {
	if s, ok := ctx.Value(callSiteKey{}).(string); ok {
		return s
	}
	return callSite()
}

// pinning is the advisory-lock state of one wrapped Postgres database: the
// connections holding session locks, and the monitor that checks they are
// still alive. Lock order: pinning.mu before any connection's pin.mu; code
// holding a pin.mu never calls into pinning.
type pinning struct {
	c *connector

	mu      sync.Mutex
	holders map[*conn]struct{}
	closed  bool
	stop    chan struct{} // closes the running monitor; nil when none runs
	done    chan struct{}
}

// observe returns the gauges' values.
func (p *pinning) observe() (held, parked int64) {
	p.mu.Lock()
	holders := make([]*conn, 0, len(p.holders))
	for h := range p.holders {
		holders = append(holders, h)
	}
	p.mu.Unlock()
	for _, h := range holders {
		h.pin.mu.Lock()
		held += int64(len(h.pin.held))
		if h.pin.parked {
			parked++
		}
		h.pin.mu.Unlock()
	}
	return held, parked
}

// register notes that c holds session locks and starts the monitor.
func (p *pinning) register(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holders[c] = struct{}{}
	if p.stop == nil && !p.closed {
		p.stop, p.done = make(chan struct{}), make(chan struct{})
		go p.monitor(p.stop, p.done)
	}
}

// unregister forgets c.
func (p *pinning) unregister(c *conn) {
	p.mu.Lock()
	delete(p.holders, c)
	p.mu.Unlock()
}

// unregisterIfEmpty forgets c unless it holds locks again by now.
func (p *pinning) unregisterIfEmpty(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.pin.mu.Lock()
	empty := len(c.pin.held) == 0
	c.pin.mu.Unlock()
	if empty {
		delete(p.holders, c)
	}
}

// holderOf returns a connection other than except that holds k.
func (p *pinning) holderOf(k lockKey, except *conn) *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := range p.holders {
		if h == except {
			continue
		}
		h.pin.mu.Lock()
		_, ok := h.pin.held[k]
		h.pin.mu.Unlock()
		if ok {
			return h
		}
	}
	return nil
}

// monitor checks, every interval, that the holders' backends still hold
// their locks, until no connection holds any.
func (p *pinning) monitor(stop, done chan struct{}) {
	defer close(done)
	var side driver.Conn
	defer func() {
		if side != nil {
			side.Close()
		}
	}()
	t := time.NewTicker(p.c.opts.lockCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		if len(p.holders) == 0 {
			p.stop = nil
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		var err error
		if side, err = p.check(side); err != nil {
			p.c.opts.logger.Warn("lockhooks: checking advisory-lock holders failed; will retry", "error", err)
		}
	}
}

// holderSnapshot is what the monitor knows of one holder before it asks.
type holderSnapshot struct {
	c    *conn
	pid  int32
	gen  uint64
	keys []lockKey
}

// check asks the server whether the holders' backends are alive and hold
// their locks, on a side connection of its own (never a holder's).
func (p *pinning) check(side driver.Conn) (driver.Conn, error) {
	p.mu.Lock()
	var snaps []holderSnapshot
	for h := range p.holders {
		h.pin.mu.Lock()
		if h.pid != 0 && h.pin.busy == 0 && h.pin.lost == nil && len(h.pin.held) > 0 {
			s := holderSnapshot{c: h, pid: h.pid, gen: h.pin.gen}
			for k := range h.pin.held {
				s.keys = append(s.keys, k)
			}
			snaps = append(snaps, s)
		}
		h.pin.mu.Unlock()
	}
	p.mu.Unlock()
	p.warnParked()
	if len(snaps) == 0 {
		return side, nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), p.c.opts.lockCheckTimeout)
	defer cancel()
	if side == nil {
		var err error
		if side, err = p.c.inner.Connect(ctx); err != nil {
			return nil, err
		}
	}
	pids := make([]string, len(snaps))
	for i, s := range snaps {
		pids[i] = strconv.Itoa(int(s.pid))
	}
	alive, held, err := queryAdvisoryLocks(ctx, side, "a.pid IN ("+strings.Join(pids, ",")+")")
	if err != nil {
		side.Close()
		return nil, err
	}
	for _, s := range snaps {
		s.c.pin.mu.Lock()
		changed := s.c.pin.gen != s.gen || s.c.pin.busy > 0
		s.c.pin.mu.Unlock()
		if changed {
			continue // it ran a lock statement meanwhile; look again next time
		}
		if !alive[s.pid] {
			s.c.loseLocks(fmt.Errorf("its backend (pid %d) is gone", s.pid))
			continue
		}
		for _, k := range s.keys {
			if !held[s.pid][k] {
				// Released by something lockhooks could not see (a server-side
				// function): the truth is in pg_locks.
				s.c.forgetLock(k)
			}
		}
	}
	return side, nil
}

// warnParked logs locks parked longer than the threshold, once each.
func (p *pinning) warnParked() {
	threshold := p.c.opts.parkedWarning
	if threshold <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := range p.holders {
		h.pin.mu.Lock()
		if h.pin.parked && !h.pin.warned && time.Since(h.pin.parkedAt) > threshold {
			h.pin.warned = true
			for k, l := range h.pin.held {
				p.c.opts.logger.Warn("lockhooks: a session advisory lock is still held by a connection withdrawn from the pool; unlock it with pg_advisory_unlock through this database",
					"key", k.String(), "backend_pid", h.pid, "held_for", time.Since(l.since).Round(time.Millisecond).String(),
					"taken_at", l.site, "connection", h.id)
			}
		}
		h.pin.mu.Unlock()
	}
}

// close is called by db.Close: parked connections are closed, which
// releases their locks, and each release is logged.
func (p *pinning) close() {
	p.mu.Lock()
	p.closed = true
	stop, done := p.stop, p.done
	p.stop = nil
	holders := make([]*conn, 0, len(p.holders))
	for h := range p.holders {
		holders = append(holders, h)
	}
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	for _, h := range holders {
		h.pin.mu.Lock()
		parked := h.pin.parked
		for k, l := range h.pin.held {
			if parked {
				p.c.opts.logger.Warn("lockhooks: db.Close releases a session advisory lock still held by a parked connection",
					"key", k.String(), "backend_pid", h.pid, "held_for", time.Since(l.since).Round(time.Millisecond).String(), "taken_at", l.site)
			}
		}
		h.pin.held = nil
		h.pin.mu.Unlock()
		if parked {
			p.unregister(h)
			h.inner.Close()
		}
	}
}

// queryAdvisoryLocks reads, for the backends matched by where (over
// pg_stat_activity a), which are alive and which advisory locks they hold.
func queryAdvisoryLocks(ctx context.Context, c driver.Conn, where string) (alive map[int32]bool, held map[int32]map[lockKey]bool, err error) {
	q := `SELECT a.pid, l.classid::bigint, l.objid::bigint, l.objsubid::int, l.mode
FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
WHERE ` + where
	rows, err := queryDirect(ctx, c, q, nil)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	alive, held = map[int32]bool{}, map[int32]map[lockKey]bool{}
	dest := make([]driver.Value, 5)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return alive, held, nil
			}
			return nil, nil, err
		}
		pid := int32(asInt64(dest[0]))
		alive[pid] = true
		if dest[1] == nil {
			continue
		}
		classid, objid := asInt64(dest[1]), asInt64(dest[2])
		k := lockKey{shared: dest[4] == "ShareLock"}
		if asInt64(dest[3]) == 2 {
			k.pair, k.k1, k.k2 = true, int64(int32(uint32(classid))), int64(int32(uint32(objid)))
		} else {
			k.k1 = classid<<32 | objid
		}
		if held[pid] == nil {
			held[pid] = map[lockKey]bool{}
		}
		held[pid][k] = true
	}
}

// queryDirect runs query on a raw driver connection.
func queryDirect(ctx context.Context, c driver.Conn, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := c.(driver.QueryerContext); ok {
		return q.QueryContext(ctx, query, args)
	}
	s, err := c.Prepare(query)
	if err != nil {
		return nil, err
	}
	rows, err := stmtQuery(ctx, s, args)
	if err != nil {
		s.Close()
		return nil, err
	}
	return closingRows{Rows: rows, stmt: s}, nil
}

// asInt64 converts the integer values drivers return.
func asInt64(v driver.Value) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case int32:
		return int64(x)
	case int:
		return int64(x)
	case []byte:
		n, _ := strconv.ParseInt(string(x), 10, 64)
		return n
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// keyOf resolves a call's key from literals and bound arguments.
func keyOf(call sqlscan.AdvisoryCall, args []driver.NamedValue) (lockKey, bool) {
	k := lockKey{shared: call.Func&sqlscan.FnShared != 0, pair: call.NArgs == 2}
	if call.NArgs != 1 && call.NArgs != 2 {
		return k, false
	}
	var vals [2]int64
	for i := range call.NArgs {
		a := call.Args[i]
		switch a.Kind {
		case sqlscan.ArgLiteral:
			vals[i] = a.Value
		case sqlscan.ArgParam:
			v, ok := argInt(args, a.Param)
			if !ok {
				return k, false
			}
			vals[i] = v
		default:
			return k, false
		}
	}
	k.k1, k.k2 = vals[0], vals[1]
	return k, true
}

// evalKey resolves a call's key, asking the server to evaluate arguments
// that are expressions (hashtext('name')).
func (c *conn) evalKey(ctx context.Context, call sqlscan.AdvisoryCall, args []driver.NamedValue) (lockKey, bool) {
	if k, ok := keyOf(call, args); ok {
		return k, true
	}
	k := lockKey{shared: call.Func&sqlscan.FnShared != 0, pair: call.NArgs == 2}
	if call.NArgs != 1 && call.NArgs != 2 {
		return k, false
	}
	typ := "bigint"
	if k.pair {
		typ = "int4"
	}
	exprs := make([]string, call.NArgs)
	for i := range call.NArgs {
		a := call.Args[i]
		switch a.Kind {
		case sqlscan.ArgLiteral:
			exprs[i] = strconv.FormatInt(a.Value, 10)
		case sqlscan.ArgParam:
			exprs[i] = "$" + strconv.Itoa(a.Param)
		default:
			exprs[i] = "(" + a.Text + ")"
		}
		exprs[i] += "::" + typ
	}
	row, err := c.queryRow(ctx, "SELECT "+strings.Join(exprs, ", "), args)
	if err != nil || len(row) != call.NArgs {
		return k, false
	}
	k.k1 = asInt64(row[0])
	if k.pair {
		k.k2 = asInt64(row[1])
	}
	return k, true
}

// argInt returns bound argument n (1-based) as an integer.
func argInt(args []driver.NamedValue, n int) (int64, bool) {
	for _, a := range args {
		if a.Ordinal != n {
			continue
		}
		v := a.Value
		if valuer, ok := v.(driver.Valuer); ok {
			var err error
			if v, err = valuer.Value(); err != nil {
				return 0, false
			}
		}
		if n, isInt, fits := integerValue(v); isInt {
			return n, fits
		}
		if x, ok := v.(string); ok {
			if n, err := strconv.ParseInt(x, 10, 64); err == nil {
				return n, true
			}
		}
		return 0, false
	}
	return 0, false
}

// integerValue converts a value of any of Go's integer types to int64:
// isInt reports whether v has an integer type, fits whether its value
// fits an int64.
func integerValue(v any) (n int64, isInt, fits bool) {
	switch x := v.(type) {
	case int64:
		return x, true, true
	case int:
		return int64(x), true, true
	case int32:
		return int64(x), true, true
	case int16:
		return int64(x), true, true
	case int8:
		return int64(x), true, true
	case uint32:
		return int64(x), true, true
	case uint16:
		return int64(x), true, true
	case uint8:
		return int64(x), true, true
	case uint:
		return int64(x), true, uint64(x) <= 1<<63-1
	case uint64:
		return int64(x), true, x <= 1<<63-1
	}
	return 0, false, false
}

// advisoryPlan is what the hooks do around one statement that calls
// advisory-lock functions, or that runs on a connection holding locks.
type advisoryPlan struct {
	st   statement
	args []driver.NamedValue
	site string
	wait *lockWait // the statement's lock wait, when it takes locks
}

// beforeAdvisory runs before a statement on the slow path. It may answer
// the statement itself (a rerouted unlock): then handled is true and
// result is the unlock's result.
func (c *conn) beforeAdvisory(ctx context.Context, st statement, args []driver.NamedValue) (plan advisoryPlan, handled bool, err error) {
	plan = advisoryPlan{st: st, args: args}
	c.pin.mu.Lock()
	lost := c.pin.lost
	c.pin.mu.Unlock()
	if lost != nil {
		return plan, false, lost
	}
	if c.pin.active.Load() {
		// database/sql would let the driver see a cancelled context, and pgx
		// then closes the connection: every lock it holds would be gone.
		if err := ctx.Err(); err != nil {
			return plan, false, err
		}
	}
	adv := st.advisory
	if adv == nil {
		if st.rowLock {
			plan.wait = c.startRowLockWait(ctx, st)
		}
		return plan, false, nil
	}
	for _, call := range adv.Calls {
		if call.Func&sqlscan.FnXact != 0 && c.tx.inner == nil {
			return plan, false, fmt.Errorf("lockhooks: %s outside a transaction is released as soon as the statement ends, so it protects nothing; call it inside a transaction (db.BeginTx), or use a session lock (lockhooks.AcquireAdvisoryLock)", call.Func.Name())
		}
	}
	if adv.Simple && adv.Calls[0].Func&sqlscan.FnUnlock != 0 {
		if k, ok := c.evalKey(ctx, adv.Calls[0], args); ok && !c.holds(k) {
			return plan, true, c.connector.pins.rerouteUnlock(ctx, c, k)
		}
	}
	plan.site = siteOf(ctx)
	c.warnSelfWait(adv, args, plan.site)
	plan.wait = c.startAdvisoryWait(ctx, adv, args)
	c.pin.mu.Lock()
	c.pin.busy++
	c.pin.gen++
	c.pin.mu.Unlock()
	return plan, false, nil
}

// afterAdvisory runs after the statement (for queries: after its rows were
// closed) and brings the connection's lock tracking up to date.
func (c *conn) afterAdvisory(ctx context.Context, plan advisoryPlan, err error) error {
	adv := plan.st.advisory
	if adv == nil {
		if err != nil && c.connectionBroken(err) {
			return c.lostError(c.loseLocks(err), err)
		}
		return err
	}
	defer func() {
		c.pin.mu.Lock()
		c.pin.busy--
		c.pin.gen++
		c.pin.mu.Unlock()
	}()
	ctx = context.WithoutCancel(ctx)
	if err != nil {
		if c.connectionBroken(err) {
			if lost := c.loseLocks(err); lost != nil {
				return c.lostError(lost, err)
			}
			return err
		}
		if !adv.Simple {
			c.reconcileSoon(ctx) // a failed multi-call statement may have taken some
		}
		return err
	}
	if adv.DiscardAll {
		c.clearLocks()
		return nil
	}
	if adv.Simple {
		call := adv.Calls[0]
		if call.Func&sqlscan.FnUnlockAll != 0 {
			c.clearLocks()
			return nil
		}
		if call.Func&sqlscan.FnXact != 0 {
			return nil
		}
		if k, ok := keyOf(call, plan.args); ok {
			switch {
			case call.Func&sqlscan.FnUnlock != 0:
				c.forgetLock(k)
			case call.Func&sqlscan.FnTry != 0 && !c.holds(k):
				// Whether a try succeeded is in pg_locks.
				c.reconcile(ctx, plan.site)
			default:
				c.addLock(ctx, k, plan.site)
			}
			return nil
		}
	}
	c.reconcileSoon(ctx)
	if c.tx.inner == nil {
		c.reconcile(ctx, plan.site)
	}
	return nil
}

// warnSelfWait logs a lock request that will wait for a connection of this
// same database parked with the lock: if the same code path took it, the
// request waits for itself.
func (c *conn) warnSelfWait(adv *sqlscan.Advisory, args []driver.NamedValue, site string) {
	for _, call := range adv.Calls {
		if call.Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 {
			continue
		}
		k, ok := keyOf(call, args)
		if !ok || c.holds(k) {
			continue
		}
		h := c.connector.pins.holderOf(k, c)
		if h == nil {
			continue
		}
		h.pin.mu.Lock()
		parked, l := h.pin.parked, h.pin.held[k]
		var taken string
		if l != nil {
			taken = l.site
		}
		h.pin.mu.Unlock()
		if parked && (!k.shared || h.holdsExclusive(k)) {
			c.connector.opts.logger.Warn("lockhooks: an advisory lock request waits for a connection of this same database that holds the lock outside the pool; if the same code took it, it waits for itself: unlock it first (pg_advisory_unlock through this database), or take locks with lockhooks.AcquireAdvisoryLock",
				"key", k.String(), "requested_at", site, "holder", h.id, "holder_pid", h.pid, "taken_at", taken)
		}
	}
}

// holdsExclusive reports whether c holds k in exclusive mode.
func (c *conn) holdsExclusive(k lockKey) bool {
	k.shared = false
	return c.holds(k)
}

// reconcileSoon reconciles now outside a transaction, or once it ends
// (inside one, pg_locks also shows transaction-level locks).
func (c *conn) reconcileSoon(ctx context.Context) {
	if c.tx.inner != nil {
		c.pin.mu.Lock()
		c.pin.recheck = true
		c.pin.mu.Unlock()
		return
	}
	c.reconcile(ctx, siteOf(ctx))
}

// holds reports whether c holds k.
func (c *conn) holds(k lockKey) bool {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	return c.pin.held[k] != nil
}

// addLock records one more acquisition of k.
func (c *conn) addLock(ctx context.Context, k lockKey, site string) {
	c.pin.mu.Lock()
	if c.pin.held == nil {
		c.pin.held = make(map[lockKey]*heldLock)
	}
	l := c.pin.held[k]
	if l == nil {
		l = &heldLock{since: time.Now(), site: site, span: trace.SpanContextFromContext(ctx)}
		c.pin.held[k] = l
	}
	l.count++
	c.pin.gen++
	c.pin.mu.Unlock()
	c.pin.active.Store(true)
	if c.pid == 0 {
		c.backendPID(ctx) // the monitor finds the backend by pid
	}
	c.connector.pins.register(c)
}

// forgetLock records one release of k; it reports whether c holds nothing
// more.
func (c *conn) forgetLock(k lockKey) (empty bool) {
	c.pin.mu.Lock()
	if l := c.pin.held[k]; l != nil {
		if l.count--; l.count <= 0 {
			delete(c.pin.held, k)
			c.connector.tel.recordHold(context.Background(), "advisory", "session", l.since)
		}
	}
	c.pin.gen++
	empty = c.emptyLocked()
	c.pin.mu.Unlock()
	if empty {
		c.connector.pins.unregisterIfEmpty(c)
	}
	return empty
}

// clearLocks records that c holds no session lock.
func (c *conn) clearLocks() {
	c.pin.mu.Lock()
	c.pin.held = nil
	c.pin.gen++
	empty := c.emptyLocked()
	c.pin.mu.Unlock()
	if empty {
		c.connector.pins.unregisterIfEmpty(c)
	}
}

// emptyLocked reports whether c holds nothing (and lost nothing), and then
// takes it off the slow path; c.pin.mu is held. The caller unregisters c
// after releasing c.pin.mu: the lock order is pinning.mu, then pin.mu.
func (c *conn) emptyLocked() bool {
	if len(c.pin.held) > 0 || c.pin.lost != nil {
		return false
	}
	c.pin.active.Store(false)
	return true
}

// reconcile makes the tracking equal to pg_locks for this backend: keys the
// server shows are held (count 1 if new), keys it does not are forgotten.
func (c *conn) reconcile(ctx context.Context, site string) {
	ctx, cancel := context.WithTimeout(ctx, c.connector.opts.lockCheckTimeout)
	defer cancel()
	pid, err := c.backendPID(ctx)
	if err != nil {
		c.connector.opts.logger.Warn("lockhooks: cannot read pg_locks to track advisory locks", "connection", c.id, "error", err)
		return
	}
	_, held, err := queryAdvisoryLocks(ctx, c.inner, "a.pid = "+strconv.Itoa(int(pid)))
	if err != nil {
		c.observe(err)
		c.connector.opts.logger.Warn("lockhooks: cannot read pg_locks to track advisory locks", "connection", c, "error", err)
		return
	}
	now := time.Now()
	c.pin.mu.Lock()
	c.pin.recheck = false
	for k := range c.pin.held {
		if !held[pid][k] {
			delete(c.pin.held, k)
		}
	}
	for k := range held[pid] {
		if c.pin.held == nil {
			c.pin.held = make(map[lockKey]*heldLock)
		}
		if c.pin.held[k] == nil {
			c.pin.held[k] = &heldLock{count: 1, since: now, site: site}
		}
	}
	c.pin.gen++
	empty := c.emptyLocked()
	c.pin.mu.Unlock()
	if empty {
		c.connector.pins.unregisterIfEmpty(c)
		return
	}
	c.pin.active.Store(true)
	c.connector.pins.register(c)
}

// connectionBroken reports whether err means the connection is gone, so its
// session locks are too: a driver error that is not the server's, or the
// server's own "terminating connection" and connection-exception errors.
func (c *conn) connectionBroken(err error) bool {
	if errors.Is(err, driver.ErrBadConn) {
		return true
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		code := pg.SQLState()
		return strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03"
	}
	if !c.suspect.Load() {
		return false
	}
	// Not the server's error: ask whether the connection is still there.
	return !c.alive()
}

// alive pings the connection.
func (c *conn) alive() bool {
	if c.pinger == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	return c.pinger.Ping(ctx) == nil
}

// loseLocks records that c's session locks are gone because its
// connection died, reports it, and returns the error to give to whoever
// relied on them (nil if c held none).
func (c *conn) loseLocks(cause error) error {
	c.pin.mu.Lock()
	if c.pin.lost != nil {
		defer c.pin.mu.Unlock()
		return c.pin.lost
	}
	if len(c.pin.held) == 0 {
		c.pin.mu.Unlock()
		return nil
	}
	keys := make([]string, 0, len(c.pin.held))
	var oldest *heldLock
	for k, l := range c.pin.held {
		keys = append(keys, k.String())
		if oldest == nil || l.since.Before(oldest.since) {
			oldest = l
		}
	}
	sort.Strings(keys)
	n := len(c.pin.held)
	c.pin.lost = fmt.Errorf("%w: %v held advisory lock %s (taken at %s, %v ago) and its connection died (%v); the work it protected must stop",
		ErrLockLost, c, strings.Join(keys, ", "), oldest.site, time.Since(oldest.since).Round(time.Millisecond), cause)
	c.pin.held = nil
	c.pin.gen++
	parked := c.pin.parked
	if c.pin.lostCh == nil {
		c.pin.lostCh = make(chan struct{})
	}
	lostCh, lost := c.pin.lostCh, c.pin.lost
	c.pin.mu.Unlock()

	c.pin.active.Store(true) // statements now fail with lost
	c.connector.pins.unregister(c)
	c.connector.tel.lockLost(context.Background(), "advisory", n)
	c.connector.opts.logger.Error("lockhooks: advisory lock lost", "connection", c.id, "backend_pid", c.pid,
		"keys", strings.Join(keys, ", "), "taken_at", oldest.site, "parked", parked, "cause", cause.Error())
	close(lostCh) // after the log and the count, so whoever waits on Lost sees them
	if parked {
		c.inner.Close()
	}
	return lost
}

// lostError combines the lost-lock error with the driver's error; a
// driver.ErrBadConn is not wrapped, so database/sql does not retry the
// protected work on a fresh connection.
func (c *conn) lostError(lost, err error) error {
	if lost == nil {
		return err
	}
	if errors.Is(err, driver.ErrBadConn) {
		return lost
	}
	return fmt.Errorf("%w (the statement failed with: %w)", lost, err)
}

// lostChan returns the channel closed when c's locks are lost.
func (c *conn) lostChan() <-chan struct{} {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	if c.pin.lostCh == nil {
		c.pin.lostCh = make(chan struct{})
	}
	return c.pin.lostCh
}

// park withdraws c, which holds session locks, instead of closing it.
func (c *conn) park() bool {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	if len(c.pin.held) == 0 || c.pin.lost != nil {
		return false
	}
	c.pin.parked, c.pin.parkedAt = true, time.Now()
	return true
}

// holdsLocks reports whether c must stay out of the pool.
func (c *conn) holdsLocks() bool {
	if !c.pin.active.Load() {
		return false
	}
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	return len(c.pin.held) > 0 || c.pin.lost != nil
}

// rerouteUnlock releases k on the parked connection that holds it, for an
// unlock sent on from, which does not hold it.
func (p *pinning) rerouteUnlock(ctx context.Context, from *conn, k lockKey) error {
	h := p.holderOf(k, from)
	if h == nil {
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v: no connection of this database holds that lock (Postgres would answer false); unlock only what you locked, with the same key and mode",
			ErrNotLockOwner, sharedSuffix(k), k, from)
	}
	h.pin.mu.Lock()
	parked := h.pin.parked
	l := h.pin.held[k]
	var site string
	var since time.Time
	if l != nil {
		site, since = l.site, l.since
	}
	h.pin.mu.Unlock()
	if !parked {
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v: the lock is held by %v, which is in use (taken at %s, %v ago); unlock it on that connection (hold a *sql.Conn, or use lockhooks.AcquireAdvisoryLock)",
			ErrNotLockOwner, sharedSuffix(k), k, from, h, site, time.Since(since).Round(time.Millisecond))
	}

	h.pin.exec.Lock()
	defer h.pin.exec.Unlock()
	q, args := k.unlockQuery()
	v, err := h.queryValue(ctx, q, args...)
	if err != nil {
		if h.connectionBroken(err) {
			return h.lostError(h.loseLocks(err), err)
		}
		return fmt.Errorf("lockhooks: rerouting pg_advisory_unlock(%s) to %v: %w", k, h, err)
	}
	if ok, _ := v.(bool); !ok {
		h.reconcile(ctx, site)
		return fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v, which lockhooks believed held it, returned false", ErrNotLockOwner, sharedSuffix(k), k, h)
	}
	p.c.tel.unlockRerouted(ctx)
	if h.forgetLock(k) {
		h.inner.Close() // parked and holding nothing more
	}
	return nil
}

func sharedSuffix(k lockKey) string {
	if k.shared {
		return "_shared"
	}
	return ""
}

// unlockResult is the answer of a rerouted unlock: one row, true.
type unlockResult struct {
	done bool
	name string
}

func (r *unlockResult) Columns() []string { return []string{r.name} }
func (r *unlockResult) Close() error      { return nil }
func (r *unlockResult) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = true
	return nil
}

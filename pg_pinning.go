package lockhooks

import (
	"context"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
// the driver close the connection) or was closed by db.Close. The work the
// lock protected must stop: other processes may hold the lock now.
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

// lockKey identifies one advisory lock: a bigint key or a pair of int4 keys
// (separate key spaces), in exclusive or shared mode.
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

// exclusive returns k in exclusive mode.
func (k lockKey) exclusive() lockKey { k.shared = false; return k }

// tryQuery returns the statement that tries to take k once.
func (k lockKey) tryQuery() (string, []driver.NamedValue) {
	fn := "pg_try_advisory_lock"
	if k.shared {
		fn += "_shared"
	}
	if k.pair {
		return "SELECT " + fn + "($1::int4, $2::int4)", []driver.NamedValue{{Ordinal: 1, Value: k.k1}, {Ordinal: 2, Value: k.k2}}
	}
	return "SELECT " + fn + "($1::bigint)", []driver.NamedValue{{Ordinal: 1, Value: k.k1}}
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

// heldLock is one session lock a connection holds.
type heldLock struct {
	count int // re-entrant acquisitions (Postgres stacks them)
	// approx: count may be off, because a statement lockhooks could not
	// read ran while the key was held (pg_locks shows no counts); the next
	// statement on the key is checked against pg_locks.
	approx bool
	since  time.Time
	site   string            // where it was taken: file:line
	span   trace.SpanContext // the span of the statement that took it
}

// pinState is what a connection knows of its advisory locks: a cache of
// pg_locks for its backend, kept exact where statement text tells the
// effect and refreshed from pg_locks where it does not.
type pinState struct {
	// active: the connection holds session locks, lost them, or is in a
	// transaction block lockhooks follows: its statements take the slow
	// path.
	active atomic.Bool

	mu       sync.Mutex
	held     map[lockKey]*heldLock // session locks
	xact     map[lockKey]int       // transaction-level locks of the current transaction, as taken by this connection
	textTx   bool                  // in a transaction block opened by statement text (BEGIN), not by database/sql
	parked   bool                  // withdrawn from the pool; owned by the pinning registry
	parkedAt time.Time
	closed   bool // the physical connection was closed by lockhooks
	warned   bool
	lost     error         // non-nil once the locks are known lost
	lostCh   chan struct{} // closed when lost is set
	gen      uint64        // changes whenever held may have changed
	busy     int           // advisory statements in flight
	recheck  bool          // read pg_locks again once the transaction ends

	// exec serialises what lockhooks itself runs on a connection that
	// database/sql no longer uses (a parked one): rerouted unlocks, reads of
	// pg_locks, Close.
	exec sync.Mutex
}

// updateActiveLocked recomputes whether statements need the slow path;
// c.pin.mu is held.
func (c *conn) updateActiveLocked() {
	c.pin.active.Store(len(c.pin.held) > 0 || c.pin.lost != nil || c.pin.textTx || c.pin.recheck || len(c.pin.xact) > 0)
}

// inTx reports whether the connection is inside a transaction block, opened
// by database/sql or by statement text.
func (c *conn) inTx() bool {
	if c.tx.inner != nil {
		return true
	}
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	return c.pin.textTx
}

// pinning is the advisory-lock state of one wrapped Postgres database: the
// connections holding session locks (in use or parked), the AdvisoryLocks
// handed out, and the monitor that checks holders are still alive.
//
// Lock order: pinning.mu, then a connection's pin.exec, then its pin.mu.
// Code holding a pin.mu never calls into pinning; code holding pinning.mu
// never takes a pin.exec.
type pinning struct {
	c *connector

	mu      sync.Mutex
	holders map[*conn]struct{}
	locks   map[*AdvisoryLock]struct{} // handed out and not released
	closed  bool
	stop    chan struct{} // closes the running monitor; nil when none runs
	done    chan struct{}
}

func newPinning(c *connector) *pinning {
	return &pinning{c: c, holders: make(map[*conn]struct{}), locks: make(map[*AdvisoryLock]struct{})}
}

// observe returns the gauges' values.
func (p *pinning) observe() (held, parked int64) {
	for _, h := range p.snapshot() {
		h.pin.mu.Lock()
		held += int64(len(h.pin.held))
		if h.pin.parked {
			parked++
		}
		h.pin.mu.Unlock()
	}
	return held, parked
}

// snapshot returns the holders.
func (p *pinning) snapshot() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	holders := make([]*conn, 0, len(p.holders))
	for h := range p.holders {
		holders = append(holders, h)
	}
	return holders
}

// register notes that c holds session locks and starts the monitor.
func (p *pinning) register(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.pin.mu.Lock()
	live := len(c.pin.held) > 0 && c.pin.lost == nil && !c.pin.closed
	c.pin.mu.Unlock()
	if !live {
		return // emptied, lost or closed meanwhile by another goroutine
	}
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

// holderOf returns a connection other than except that holds k,
// preferring a parked one (a shared key may have several holders, and only
// a parked one can take a rerouted unlock).
func (p *pinning) holderOf(k lockKey, except *conn) *conn {
	var inUse *conn
	for _, h := range p.snapshot() {
		if h == except {
			continue
		}
		h.pin.mu.Lock()
		_, ok := h.pin.held[k]
		parked := h.pin.parked
		h.pin.mu.Unlock()
		switch {
		case ok && parked:
			return h
		case ok:
			inUse = h
		}
	}
	return inUse
}

// track notes an AdvisoryLock handed out, for db.Close; false once
// db.Close has run.
func (p *pinning) track(l *AdvisoryLock) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.locks[l] = struct{}{}
	return true
}

// untrack forgets a released AdvisoryLock.
func (p *pinning) untrack(l *AdvisoryLock) {
	p.mu.Lock()
	delete(p.locks, l)
	p.mu.Unlock()
}

// isClosed reports whether db.Close has run.
func (p *pinning) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// settle is called whenever c's locks may have changed: a connection that
// holds nothing more is forgotten, and if it was parked it is closed, by
// whoever found out. It must be called without c.pin.exec held.
func (p *pinning) settle(c *conn) {
	c.pin.mu.Lock()
	empty := len(c.pin.held) == 0
	lost := c.pin.lost != nil
	closeIt := c.pin.parked && (empty || lost) && !c.pin.closed
	c.pin.mu.Unlock()
	if empty || lost {
		p.mu.Lock()
		c.pin.mu.Lock()
		if len(c.pin.held) == 0 || c.pin.lost != nil {
			delete(p.holders, c)
		}
		c.pin.mu.Unlock()
		p.mu.Unlock()
	} else {
		p.register(c)
	}
	if closeIt {
		c.closeInner()
	}
}

// closeInner closes the physical connection once, after whatever lockhooks
// runs on it.
func (c *conn) closeInner() error {
	c.pin.exec.Lock()
	defer c.pin.exec.Unlock()
	c.pin.mu.Lock()
	if c.pin.closed {
		c.pin.mu.Unlock()
		return nil
	}
	c.pin.closed = true
	c.pin.mu.Unlock()
	c.connector.forget(c)
	c.closeHolder()
	return c.inner.Close()
}

// close is called by db.Close: every connection lockhooks kept for its
// locks is closed, which releases them on the server: parked ones at once,
// those of AdvisoryLocks through their *sql.Conn; a *sql.Conn the
// application still holds is closed by database/sql when it is returned,
// and its locks are reported lost now. One log line says what was released.
func (p *pinning) close() {
	p.mu.Lock()
	p.closed = true
	stop, done := p.stop, p.done
	p.stop = nil
	holders := make([]*conn, 0, len(p.holders))
	for h := range p.holders {
		holders = append(holders, h)
	}
	locks := make([]*AdvisoryLock, 0, len(p.locks))
	for l := range p.locks {
		locks = append(locks, l)
	}
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	var released []string
	for _, h := range holders {
		h.pin.mu.Lock()
		for k, l := range h.pin.held {
			state := "in use"
			if h.pin.parked {
				state = "parked"
			}
			released = append(released, fmt.Sprintf("%s on %v (%s, taken at %s, %v ago)", k, h, state, l.site, time.Since(l.since).Round(time.Millisecond)))
		}
		h.pin.mu.Unlock()
		h.markLost("db.Close closed its connection, which released it", nil, false)
		p.settle(h)
	}
	for _, l := range locks {
		l.conn.Close() // database/sql closes it: the database is closed
		p.c.turns.unlock(l.key, l.turn)
	}
	if len(released) > 0 {
		sort.Strings(released)
		p.c.opts.logger.Warn("lockhooks: db.Close releases session advisory locks still held: "+strings.Join(released, "; "),
			"locks", len(released))
	}
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
// that are expressions (hashtext('name')). A volatile expression may
// evaluate differently in the statement itself, so keys found this way are
// checked against pg_locks after the statement.
func (c *conn) evalKey(ctx context.Context, call sqlscan.AdvisoryCall, args []driver.NamedValue) (lockKey, bool) {
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
	row, err := c.queryRow(ctx, "SELECT "+strings.Join(exprs, ", ")+c.afterDiscard(), args)
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
	st    statement
	args  []driver.NamedValue
	site  string
	wait  *lockWait // the statement's lock wait, when it takes locks
	keys  []lockKey // the key of each call of st.advisory, where known
	known []bool
	// exact: each call runs once (a target list) and every key is known,
	// so the effect on locks follows from the text and the results.
	exact bool
	// verify: read pg_locks after the statement (keys evaluated apart from
	// the statement, or effects the text does not show).
	verify bool
	// onHolder: the statement runs on the connection's holder
	// (WithTransactionPooler).
	onHolder bool
	// approx: a key of the statement had a count that may be off before it.
	approx bool
}

// beforeAdvisory runs before a statement on the slow path. It may answer
// the statement itself (a rerouted unlock): then answer is the statement's
// result.
func (c *conn) beforeAdvisory(ctx context.Context, st statement, args []driver.NamedValue) (plan advisoryPlan, answer *staticRows, err error) {
	plan = advisoryPlan{st: st, args: args}
	c.pin.mu.Lock()
	lost := c.pin.lost
	c.pin.mu.Unlock()
	if lost != nil {
		return plan, nil, lost
	}
	if c.pin.active.Load() {
		// database/sql would let the driver see a cancelled context, and pgx
		// then closes the connection: every lock it holds would be gone.
		if err := ctx.Err(); err != nil {
			return plan, nil, err
		}
	}
	adv := st.advisory
	if adv == nil {
		if st.rowLock {
			plan.wait = c.startRowLockWait(ctx, st)
		}
		return plan, nil, nil
	}
	plan.keys, plan.known = make([]lockKey, len(adv.Calls)), make([]bool, len(adv.Calls))
	plan.exact = adv.TargetList && !adv.Uncertain
	plan.verify = !plan.exact && !adv.DiscardAll
	for i, call := range adv.Calls {
		k, ok := keyOf(call, args)
		if !ok && call.Func&sqlscan.FnUnlockAll == 0 && adv.TargetList && !adv.Uncertain {
			if k, ok = c.evalKey(ctx, call, args); ok {
				plan.verify = true
			}
		}
		plan.keys[i], plan.known[i] = k, ok || call.Func&sqlscan.FnUnlockAll != 0
		plan.exact = plan.exact && plan.known[i]
	}
	if c.anyApprox(plan.keys, plan.known) {
		plan.verify, plan.approx = true, true
	}
	if plan.onHolder, err = c.onHolder(adv); err != nil {
		return plan, nil, err
	}
	if c.connector.opts.txPooler {
		if err := c.splitConflict(adv, plan.keys, plan.known); err != nil {
			return plan, nil, err
		}
	}
	if err := c.refuseUselessXact(ctx, adv); err != nil {
		return plan, nil, err
	}
	if adv.Simple && adv.Calls[0].Func&sqlscan.FnUnlock != 0 && plan.known[0] && !c.holds(plan.keys[0]) {
		if err := c.connector.pins.rerouteUnlock(ctx, c, plan.keys[0]); err != nil {
			return plan, nil, err
		}
		return plan, &staticRows{cols: []string{adv.Calls[0].Column}, row: []driver.Value{true}}, nil
	}
	if !plan.onHolder && plan.exact && !c.connector.opts.txPooler && takesOrFreesSession(adv) {
		// A session lock through a transaction-mode pooler would land on a
		// server connection other clients reuse: pg_locks, read right
		// after, says whether it is where this connection is.
		plan.verify = true
	}
	plan.site = siteOf(ctx)
	if plan.exact && !adv.Simple {
		if err := c.checkUnlocks(adv, plan.keys, plan.site); err != nil {
			return plan, nil, err
		}
	}
	c.warnSelfWait(adv, plan.keys, plan.known, plan.site)
	plan.wait = c.startAdvisoryWait(ctx, adv, args, plan.site)
	c.pin.mu.Lock()
	c.pin.busy++
	c.pin.gen++
	c.pin.mu.Unlock()
	return plan, nil, nil
}

// takesOrFreesSession reports whether a statement takes or releases a
// session lock.
func takesOrFreesSession(adv *sqlscan.Advisory) bool {
	for _, call := range adv.Calls {
		if call.Func&(sqlscan.FnXact|sqlscan.FnUnlockAll) == 0 {
			return true
		}
	}
	return false
}

// afterDiscard returns a comment that makes lockhooks' own query texts
// new after each DISCARD ALL, so a driver that caches prepared statements
// by text (pgx) prepares them again instead of using ones the server
// forgot.
func (c *conn) afterDiscard() string {
	if n := c.discards.Load(); n > 0 {
		return " -- lockhooks: after DISCARD ALL " + strconv.Itoa(int(n))
	}
	return ""
}

// anyApprox reports whether c holds one of keys with a count that may be off.
func (c *conn) anyApprox(keys []lockKey, known []bool) bool {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	for i, k := range keys {
		if l := c.pin.held[k]; known[i] && l != nil && l.approx {
			return true
		}
	}
	return false
}

// refuseUselessXact follows transaction-level locks outside a database/sql
// transaction: when a statement calls them, the server says whether the
// connection is in a transaction block (a BEGIN sent before lockhooks
// followed the connection). Outside one, a lone statement whose only
// effect is transaction-level locks is refused: they are released as soon
// as it ends, so it protects nothing. A transaction the statement text
// opens, or one that several statements in one text make, is followed.
func (c *conn) refuseUselessXact(ctx context.Context, adv *sqlscan.Advisory) error {
	if c.inTx() || adv.Statements > 1 {
		return nil
	}
	xact, all := false, true
	for _, call := range adv.Calls {
		if call.Func&sqlscan.FnXact != 0 {
			xact = true
		} else {
			all = false
		}
	}
	if !xact {
		return nil
	}
	inBlock, err := c.inTransactionBlock(ctx)
	if err != nil {
		return err
	}
	if inBlock {
		c.pin.mu.Lock()
		c.pin.textTx = true
		c.updateActiveLocked()
		c.pin.mu.Unlock()
		return nil
	}
	if !all || !adv.TargetList {
		return nil // other effects too; its own transaction-level locks end with it
	}
	return fmt.Errorf("lockhooks: %s outside a transaction is released as soon as the statement ends, so it protects nothing; call it inside a transaction (db.BeginTx), or use a session lock (lockhooks.AcquireAdvisoryLock)", adv.Calls[0].Func.Name())
}

// inTransactionBlock asks the server whether the connection is inside a
// transaction block: SAVEPOINT fails outside one (25P01) and, inside one,
// is released at once. An aborted block (25P02) is a block too.
func (c *conn) inTransactionBlock(ctx context.Context) (bool, error) {
	err := c.execOwn(ctx, "SAVEPOINT lockhooks_probe")
	switch sqlState(err) {
	case "":
		if err != nil {
			return false, fmt.Errorf("lockhooks: checking whether %v is in a transaction block: %w", c, err)
		}
		return true, c.execOwn(ctx, "RELEASE SAVEPOINT lockhooks_probe")
	case "25P01":
		return false, nil
	case "25P02":
		return true, nil // an aborted block is a block
	default:
		return false, fmt.Errorf("lockhooks: checking whether %v is in a transaction block: %w", c, err)
	}
}

// checkUnlocks looks at the unlocks of a statement of several calls whose
// keys this connection does not hold at that point. An unlock inside a
// larger statement cannot be sent to another connection: if another
// connection of this database holds the key, the statement is refused with
// ErrNotLockOwner naming it; if none does, the statement runs as written
// (Postgres answers false for that call, as it would without lockhooks) and
// a warning says so.
func (c *conn) checkUnlocks(adv *sqlscan.Advisory, keys []lockKey, site string) error {
	var unheld []lockKey
	c.pin.mu.Lock()
	taken := map[lockKey]int{}
	for k, l := range c.pin.held {
		taken[k] = l.count
	}
	for i, call := range adv.Calls {
		k := keys[i]
		switch {
		case call.Func&sqlscan.FnUnlockAll != 0:
			clear(taken)
		case call.Func&sqlscan.FnXact != 0:
		case call.Func&sqlscan.FnUnlock != 0:
			if taken[k] <= 0 {
				unheld = append(unheld, k)
			}
			taken[k]--
		case call.Func&sqlscan.FnTry == 0:
			taken[k]++
		}
	}
	c.pin.mu.Unlock()
	for _, k := range unheld {
		if h := c.connector.pins.holderOf(k, c); h != nil {
			err := fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v, in a statement with other advisory calls: the lock is held by %v, and an unlock inside a larger statement cannot be sent there; unlock it in a statement of its own", ErrNotLockOwner, sharedSuffix(k), k, c, h)
			c.connector.events.add(eventUnlockRefused, err.Error())
			c.connector.tel.unlockRefused(context.Background())
			return err
		}
		c.connector.opts.logger.Warn("lockhooks: an unlock of a key this connection does not hold, inside a statement with other advisory calls; Postgres answers false for it",
			"key", k.String(), "connection", c.String(), "at", site)
	}
	return nil
}

// afterAdvisory runs after the statement (for queries: after its rows were
// closed) and brings the connection's lock tracking up to date. results
// holds the first row of a target list, when the statement was a query
// whose row lockhooks saw; nil otherwise.
func (c *conn) afterAdvisory(ctx context.Context, plan advisoryPlan, results []driver.Value, err error) error {
	adv := plan.st.advisory
	if adv == nil {
		if err != nil && c.connectionBroken(err) {
			return c.lostError(c.loseLocks(err), err)
		}
		c.followTxControl(plan.st.text, false, err != nil)
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
		// A failed statement of several calls may have taken some; a
		// blocking lock cancelled (57014) may have been granted just before.
		if !adv.Simple || !plan.exact || sqlState(err) == "57014" {
			c.reconcile(ctx, plan.site, nil, true)
		}
		c.connector.pins.settle(c)
		if c.connector.opts.txPooler {
			c.releaseHolder(ctx)
		}
		return err
	}
	if adv.DiscardAll {
		c.clearLocks()
		// DISCARD ALL also deallocates the server's prepared statements
		// behind the driver's back (pgx caches them): the connection is
		// closed instead of pooled once it is returned, and lockhooks' own
		// queries change their text so the driver prepares them anew.
		c.discards.Add(1)
	}
	var pending map[lockKey]int
	if plan.exact {
		pending = c.apply(ctx, plan, results)
	}
	if adv.Statements > 1 {
		c.followTxControl(plan.st.text, true, false)
	}
	var verr error
	if plan.verify || len(pending) > 0 {
		switch verr = c.reconcile(ctx, plan.site, pending, !plan.exact); {
		case errors.Is(verr, ErrTransactionPooler):
			// The statement ran on another backend than the connection's:
			// its locks cannot be trusted.
			c.markLost(verr.Error(), verr, true)
		case verr != nil && c.connectionBroken(verr):
			verr = c.lostError(c.loseLocks(verr), verr)
		default:
			verr = nil // a failed read was logged; the next one catches up
		}
	}
	c.connector.pins.settle(c)
	if c.connector.opts.txPooler {
		c.releaseHolder(ctx)
	}
	return verr
}

// apply records the effect of a target list whose keys are all known, call
// by call, left to right. It returns the try-locks whose outcome only
// pg_locks can tell (negative counts: transaction-level ones).
func (c *conn) apply(ctx context.Context, plan advisoryPlan, results []driver.Value) (pending map[lockKey]int) {
	adv := plan.st.advisory
	inTx := c.inTx()
	span := trace.SpanContextFromContext(ctx)
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	for i, call := range adv.Calls {
		k := plan.keys[i]
		fn := call.Func
		if fn&sqlscan.FnTry != 0 {
			var got, sure bool
			if i < len(results) {
				got, sure = results[i].(bool)
			}
			if !sure && c.tryCertainLocked(k) {
				got, sure = true, true
			}
			if !sure {
				if pending == nil {
					pending = map[lockKey]int{}
				}
				if fn&sqlscan.FnXact != 0 {
					pending[k]--
				} else {
					pending[k]++
				}
				continue
			}
			if !got {
				continue
			}
		}
		switch {
		case fn&sqlscan.FnUnlockAll != 0:
			for h, l := range c.pin.held {
				c.connector.tel.recordHold(context.Background(), "advisory", "session", l.since)
				delete(c.pin.held, h)
			}
		case fn&sqlscan.FnXact != 0:
			if inTx {
				if c.pin.xact == nil {
					c.pin.xact = make(map[lockKey]int)
				}
				c.pin.xact[k]++
			}
		case fn&sqlscan.FnUnlock != 0:
			c.forgetLocked(k)
		default:
			c.addLocked(k, plan.site, span, 1)
		}
	}
	c.pin.gen++
	c.updateActiveLocked()
	return pending
}

// tryCertainLocked reports whether a try-lock of k on this connection
// certainly succeeds: the backend already holds k in that mode, or holds it
// exclusively (a backend's own locks never conflict with its requests, and
// nobody else can hold a key it holds exclusively); c.pin.mu is held.
func (c *conn) tryCertainLocked(k lockKey) bool {
	return c.pin.held[k] != nil || c.pin.held[k.exclusive()] != nil || c.pin.xact[k] > 0 || c.pin.xact[k.exclusive()] > 0
}

// addLocked records n more acquisitions of k; c.pin.mu is held.
func (c *conn) addLocked(k lockKey, site string, span trace.SpanContext, n int) {
	if c.pin.held == nil {
		c.pin.held = make(map[lockKey]*heldLock)
	}
	l := c.pin.held[k]
	if l == nil {
		l = &heldLock{since: time.Now(), site: site, span: span}
		c.pin.held[k] = l
	}
	l.count += n
}

// forgetLocked records one release of k; c.pin.mu is held.
func (c *conn) forgetLocked(k lockKey) {
	if l := c.pin.held[k]; l != nil {
		if l.count--; l.count <= 0 {
			delete(c.pin.held, k)
			c.connector.tel.recordHold(context.Background(), "advisory", "session", l.since)
		}
	}
}

// followTxControl follows the transaction blocks that statement text opens
// and closes, outside database/sql transactions: the transaction-level locks
// of a block end with it. It reads the text of statements on connections
// lockhooks follows (active), or always for advisory texts. A failed
// statement opens no block, but a failed COMMIT still ends one.
func (c *conn) followTxControl(text string, always, failed bool) {
	if c.tx.inner != nil {
		return
	}
	c.pin.mu.Lock()
	if !always && !c.pin.active.Load() && !c.pin.textTx {
		c.pin.mu.Unlock()
		return
	}
	effect := sqlscan.TxControl(text)
	if failed && effect != sqlscan.TxEnd {
		effect = sqlscan.TxNone
	}
	switch effect {
	case sqlscan.TxNone:
		c.pin.mu.Unlock()
		return
	case sqlscan.TxBegin:
		c.pin.textTx = true
		c.updateActiveLocked()
		c.pin.mu.Unlock()
		return
	}
	c.pin.textTx = effect == sqlscan.TxChain
	c.pin.mu.Unlock()
	c.transactionEnded()
}

// transactionEnded forgets the transaction-level locks of the transaction
// that just ended and, if a statement in it changed session locks in ways
// only pg_locks can tell, reads pg_locks now that the transaction's own
// locks are gone.
func (c *conn) transactionEnded() {
	c.pin.mu.Lock()
	c.pin.xact = nil
	recheck := c.pin.recheck
	c.pin.recheck = false
	c.updateActiveLocked()
	c.pin.mu.Unlock()
	if recheck {
		c.reconcile(context.Background(), "unknown", nil, true)
		c.connector.pins.settle(c)
	}
}

// warnSelfWait logs a lock request that will wait for a connection of this
// same database parked with the lock: if the same code path took it, the
// request waits for itself.
func (c *conn) warnSelfWait(adv *sqlscan.Advisory, keys []lockKey, known []bool, site string) {
	for i, call := range adv.Calls {
		if call.Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 || !known[i] {
			continue
		}
		k := keys[i]
		if c.holds(k) {
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
		if parked && (!k.shared || h.holds(k.exclusive())) {
			c.connector.opts.logger.Warn("lockhooks: an advisory lock request waits for a connection of this same database that holds the lock outside the pool; if the same code took it, it waits for itself: unlock it first (pg_advisory_unlock through this database), or take locks with lockhooks.AcquireAdvisoryLock",
				"key", k.String(), "requested_at", site, "holder", h.id, "holder_pid", h.pid.Load(), "taken_at", taken)
		}
	}
}

// holds reports whether c holds the session lock k.
func (c *conn) holds(k lockKey) bool {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	return c.pin.held[k] != nil
}

// addLock records one more acquisition of k, taken outside the statement
// hooks (lockhooks' own statements).
func (c *conn) addLock(ctx context.Context, k lockKey, site string) {
	c.pin.mu.Lock()
	c.addLocked(k, site, trace.SpanContextFromContext(ctx), 1)
	c.pin.gen++
	c.updateActiveLocked()
	c.pin.mu.Unlock()
	c.connector.pins.settle(c)
}

// forgetLock records one release of k found by the monitor or a reroute.
func (c *conn) forgetLock(k lockKey) {
	c.pin.mu.Lock()
	c.forgetLocked(k)
	c.pin.gen++
	c.updateActiveLocked()
	c.pin.mu.Unlock()
}

// clearLocks records that c holds no session lock.
func (c *conn) clearLocks() {
	c.pin.mu.Lock()
	for _, l := range c.pin.held {
		c.connector.tel.recordHold(context.Background(), "advisory", "session", l.since)
	}
	c.pin.held = nil
	c.pin.gen++
	c.updateActiveLocked()
	c.pin.mu.Unlock()
}

// addXact records transaction-level keys the transaction took through
// lockhooks' own statements (Lock on Postgres).
func (c *conn) addXact(keys []int64) {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	if c.pin.xact == nil {
		c.pin.xact = make(map[lockKey]int)
	}
	for _, k := range keys {
		c.pin.xact[lockKey{k1: k}]++
	}
	c.updateActiveLocked()
}

// reconcile makes the tracking equal to pg_locks for this backend. Keys the
// server no longer shows are forgotten; keys it shows that the connection
// did not know are learnt (pending[k] times for a try-lock of this
// statement whose outcome the text could not tell, negative for
// transaction-level ones; once otherwise). Counts the server cannot show
// are never lowered: after a statement whose effect the text did not show
// (uncertain), keys held before and after are marked approximate. Inside a
// transaction, keys the transaction took as transaction-level locks are not
// session locks, and the connection is read again once the transaction
// ends. The caller settles c afterwards; the error is the read's.
func (c *conn) reconcile(ctx context.Context, site string, pending map[lockKey]int, uncertain bool) error {
	ctx, cancel := context.WithTimeout(ctx, c.connector.opts.lockCheckTimeout)
	defer cancel()
	inTx := c.inTx()
	server, err := c.readAdvisoryLocks(ctx)
	if err != nil {
		c.pin.mu.Lock()
		if sqlState(err) == "25P01" {
			c.pin.textTx = false // the block lockhooks believed open is not
		} else if inTx {
			c.pin.recheck = true // an aborted transaction: read once it ends
		}
		c.updateActiveLocked()
		c.pin.mu.Unlock()
		if !inTx {
			c.connector.opts.logger.Warn("lockhooks: cannot read pg_locks to track advisory locks", "connection", c.String(), "error", err)
		}
		return err
	}
	now := time.Now()
	c.pin.mu.Lock()
	for k, l := range c.pin.held {
		if !server[k] {
			delete(c.pin.held, k)
			c.connector.tel.recordHold(context.Background(), "advisory", "session", l.since)
		}
	}
	for k := range c.pin.xact {
		if !server[k] {
			delete(c.pin.xact, k) // released by ROLLBACK TO SAVEPOINT
		}
	}
	for k := range server {
		n := pending[k]
		switch {
		case n < 0:
			if c.pin.xact == nil {
				c.pin.xact = make(map[lockKey]int)
			}
			c.pin.xact[k] -= n
		case c.pin.held[k] != nil:
			if uncertain {
				c.pin.held[k].approx = true
			}
		case inTx && c.pin.xact[k] > 0:
			// the transaction's own lock (a session lock on the same key
			// taken by a statement lockhooks cannot read is found at the end)
		default:
			if c.pin.held == nil {
				c.pin.held = make(map[lockKey]*heldLock)
			}
			c.pin.held[k] = &heldLock{count: max(n, 1), since: now, site: site}
		}
	}
	if inTx {
		c.pin.recheck = true
	}
	c.pin.gen++
	c.updateActiveLocked()
	c.pin.mu.Unlock()
	return nil
}

// readAdvisoryLocks reads the advisory locks pg_locks shows for this
// connection's backend, on the connection itself.
//
// Inside a transaction the read runs in a savepoint, so that its failure
// cannot abort the application's transaction.
func (c *conn) readAdvisoryLocks(ctx context.Context) (map[lockKey]bool, error) {
	if _, err := c.backendPID(ctx); err != nil {
		return nil, err
	}
	if c.connector.opts.txPooler && c.holderPID.Load() == 0 {
		// Session locks live only on a holder; the backend this connection
		// met at connect serves other clients now.
		return map[lockKey]bool{}, nil
	}
	pid := c.lockPID()
	inTx := c.inTx()
	if inTx {
		if err := c.execOwn(ctx, "SAVEPOINT lockhooks_read"); err != nil {
			return nil, err
		}
	}
	held, ranOn, err := c.queryOwnLocks(ctx, pid)
	if err == nil && ranOn != pid && !c.connector.opts.txPooler {
		err = c.poolerDetected(fmt.Sprintf("was opened on backend pid %d but its statements now run on backend pid %d", pid, ranOn))
	}
	if inTx {
		end := "RELEASE SAVEPOINT lockhooks_read"
		if err != nil {
			end = "ROLLBACK TO SAVEPOINT lockhooks_read"
		}
		if endErr := c.execOwn(ctx, end); endErr != nil && err == nil {
			err = endErr
		}
	}
	if err != nil {
		return nil, c.observe(err)
	}
	return held, nil
}

// queryOwnLocks reads the granted advisory locks of backend pid, and the
// pid of the backend that answers.
func (c *conn) queryOwnLocks(ctx context.Context, pid int32) (held map[lockKey]bool, ranOn int32, err error) {
	rows, err := queryDirect(ctx, c.inner, `SELECT pg_backend_pid(), l.classid::bigint, l.objid::bigint, l.objsubid::int, l.mode
FROM (SELECT 1) one LEFT JOIN pg_locks l ON l.pid = `+strconv.Itoa(int(pid))+` AND l.locktype = 'advisory' AND l.granted`+c.afterDiscard(), nil)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	held = map[lockKey]bool{}
	dest := make([]driver.Value, 5)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return held, ranOn, nil
			}
			return nil, 0, err
		}
		ranOn = int32(asInt64(dest[0]))
		if dest[1] != nil {
			held[advisoryKeyOf(asInt64(dest[1]), asInt64(dest[2]), asInt64(dest[3]), dest[4])] = true
		}
	}
}

// park withdraws c, which holds session locks, instead of closing it.
func (c *conn) park() bool {
	if c.connector.pins.isClosed() {
		return false
	}
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

// verifyOnReturn reads pg_locks for a connection returned to the pool that
// lockhooks believes holds nothing (WithVerifyOnReturn): locks taken where
// no statement text showed them (a server-side function) are learnt, and
// the connection is then parked instead of pooled.
func (c *conn) verifyOnReturn() {
	ctx, cancel := context.WithTimeout(context.Background(), c.connector.opts.lockCheckTimeout)
	defer cancel()
	server, err := c.readAdvisoryLocks(ctx)
	if err != nil || len(server) == 0 {
		return
	}
	c.reconcile(ctx, "unknown (found in pg_locks when the connection was returned to the pool)", nil, true)
	c.connector.pins.settle(c)
}

// heldView is what the tracking says a connection holds: session locks
// with their counts and the current transaction's locks (for tests).
type heldView struct {
	pid     int32
	session map[lockKey]int
	approx  map[lockKey]bool // session keys whose count may be off
	xact    map[lockKey]int
	lost    bool
	parked  bool
}

// view returns c's tracked locks.
func (c *conn) view() heldView {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	v := heldView{pid: c.lockPID(), session: map[lockKey]int{}, approx: map[lockKey]bool{}, xact: map[lockKey]int{}, lost: c.pin.lost != nil, parked: c.pin.parked}
	for k, l := range c.pin.held {
		v.session[k] = l.count
		if l.approx {
			v.approx[k] = true
		}
	}
	for k, n := range c.pin.xact {
		v.xact[k] = n
	}
	return v
}

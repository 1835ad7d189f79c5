package lockhooks

import (
	"context"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// ErrLockLost is wrapped by the errors that report a lock whose connection
// died (terminated backend, broken network, a cancelled statement that made
// the driver close the connection) or was closed by db.Close, and by those
// that report an AdvisoryLock released by a statement on its own
// connection. The work the lock protected must stop: other processes may
// hold the lock now.
var ErrLockLost = errors.New("lockhooks: lock lost")

// ErrNotLockOwner is wrapped by the error returned, instead of Postgres's
// silent false, for a pg_advisory_unlock that cannot be honoured: no
// connection of this database holds the key, or the one that does is in
// use elsewhere.
var ErrNotLockOwner = errors.New("lockhooks: not the lock's owner")

// LockID returns the advisory-lock key for name: the last 8 bytes of its
// SHA-256, big-endian, with the top bit cleared, the same as dstack's
// string_to_lock_id.
//
// LockID also remembers name, so that lockhooks shows the key by its name
// wherever it shows it (/debug/locks and its JSON, the slow-wait log,
// errors, span attributes): "nightly-report (4290127349813372591)". This
// memory is the package's one process-wide state: bounded (the last few
// thousand names), it costs a read-locked map lookup when the name is
// already known and one insertion when it is not.
func LockID(name string) int64 {
	k := lockID(name)
	keyNames.remember(k, name)
	return k
}

// lockID is LockID without remembering the name.
func lockID(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[24:]) & (1<<63 - 1))
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

	mu   sync.Mutex
	held map[lockKey]*heldLock // session locks
	xact map[lockKey]int       // transaction-level locks of the current transaction, as taken by this connection
	// When and where the transaction took its first transaction-level
	// lock, for /debug/locks (xact is empty: unset).
	xactSince time.Time
	xactSite  string
	xactPCs   callsite.Stack // when xactSite is "": symbolised only when shown
	textTx    bool           // in a transaction block opened by statement text (BEGIN), not by database/sql
	parked    bool           // withdrawn from the pool; owned by the pinning registry
	parkedAt  time.Time
	closed    bool // the physical connection was closed by lockhooks
	warned    bool
	lost      error         // non-nil once the locks are known lost
	lostCh    chan struct{} // closed when lost is set
	gen       uint64        // changes whenever held may have changed
	busy      int           // advisory statements in flight
	recheck   bool          // read pg_locks again once the transaction ends
	// unverified: the pg_locks read that must follow a failed lock
	// statement failed, so what the backend holds is unknown: the next
	// statement reads it first, and a return to the pool reads it or
	// closes the connection (verifyUnknown).
	unverified bool
	everHeld   bool  // has held a session lock (a session-pinning pooler keeps it pinned)
	pinnedTo   int32 // WithSessionPinningPooler: the backend pg_locks found its session locks on

	// turns are the keys whose turn in the database's in-process queue
	// the connection owns (pg_turns.go); pendingTurn is the one it took
	// for a lock statement not yet settled (hasPendingTurn).
	turns          map[int64]struct{}
	pendingTurn    int64
	hasPendingTurn bool

	// exec serialises what lockhooks itself runs on a connection that
	// database/sql no longer uses (a parked one): rerouted unlocks, reads of
	// pg_locks, Close.
	exec sync.Mutex
}

// updateActiveLocked recomputes whether statements need the slow path;
// c.pin.mu is held.
func (c *conn) updateActiveLocked() {
	if len(c.pin.held) > 0 {
		c.pin.everHeld = true
	}
	c.pin.active.Store(len(c.pin.held) > 0 || c.pin.lost != nil || c.pin.textTx || c.pin.recheck || c.pin.unverified || len(c.pin.xact) > 0)
	if len(c.pin.turns) > 0 {
		c.releaseTurnsLocked()
	}
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
	// sent is the text the statement runs with when it is not its own: an
	// exact session-lock statement on a connection that reaches the server
	// itself carries the holder's annotation instead of a pg_locks read
	// after it (annotatedLockText); "" otherwise.
	sent string
	// turn: the statement took its key's turn in the in-process queue
	// before it was sent (pg_turns.go).
	turn bool
}

// beforeAdvisory runs before a statement on the slow path. It may answer
// the statement itself (a rerouted unlock): then answer is the statement's
// result. retext says that the statement's text may be sent changed (it
// is not a prepared statement): see advisoryPlan.sent.
func (c *conn) beforeAdvisory(ctx context.Context, st statement, args []driver.NamedValue, retext bool) (plan advisoryPlan, answer *staticRows, err error) {
	plan = advisoryPlan{st: st, args: args}
	c.noteSent(st.text)
	c.pin.mu.Lock()
	lost := c.pin.lost
	c.pin.mu.Unlock()
	if lost != nil {
		return plan, nil, lost
	}
	if err := c.refuseThroughPooler(st.advisory); err != nil {
		return plan, nil, err
	}
	if c.pin.active.Load() {
		// database/sql would let the driver see a cancelled context, and pgx
		// then closes the connection: every lock it holds would be gone.
		if err := ctx.Err(); err != nil {
			return plan, nil, err
		}
		c.verifyUnknown(ctx)
	}
	adv := st.advisory
	if adv == nil {
		if err := c.checkHolder(ctx); err != nil {
			return plan, nil, err
		}
		if st.rowLock {
			plan.wait = c.startRowLockWait(ctx, st)
		}
		return plan, nil, nil
	}
	plan.keys, plan.known = keySlices(len(adv.Calls))
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
		plan.verify = true
	}
	if plan.onHolder, err = c.onHolder(adv); err != nil {
		return plan, nil, err
	}
	if !plan.onHolder {
		if err := c.checkHolder(ctx); err != nil {
			return plan, nil, err
		}
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
	if takesTurn(adv) && adv.Calls[0].Func == sqlscan.FnTry {
		// A try-lock takes the key's turn if it is free, and is answered
		// false without the server if another connection of this database
		// holds or awaits the key (pg_turns.go).
		if key, ok := c.turnKey(plan); ok {
			if !c.connector.turns.tryLock(ctx, key, c, nil, nil) {
				// Counted and traced as a try-lock the server refused.
				c.startAdvisoryWait(ctx, adv, plan.keys, plan.known, c.siteOf(ctx)).end(ctx, outcomeNotAcquired, nil)
				return plan, &staticRows{cols: []string{adv.Calls[0].Column}, row: []driver.Value{false}}, nil
			}
			c.notePendingTurn(key)
			plan.turn = true
		}
	}
	annotate := false
	if !plan.onHolder && plan.exact && !c.connector.opts.txPooler && takesOrFreesSession(adv) {
		// A session lock through a transaction-mode pooler would land on a
		// server connection other clients reuse: pg_locks, read right
		// after, says whether it is where this connection is, and the read
		// names the holder to other processes. A connection that reaches
		// the server itself needs neither: the statement's text and result
		// tell its effect, and the statement names the holder itself.
		annotate = !plan.verify && retext && adv.Simple && c.direct && c.connector.own.exec != nil && c.connector.own.ok() && integerArgs(args)
		plan.verify = !annotate
	}
	plan.site = c.siteOf(ctx)
	if annotate {
		suffix := ""
		if adv.Calls[0].Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll|sqlscan.FnXact) == 0 && ctx.Value(tokenAfterLockKey{}) != nil {
			suffix = ", " + tokenExpr // AcquireAdvisoryLock's, with its fencing token
		}
		plan.sent = c.annotatedLockText(ctx, adv.Calls[0], plan.keys[0], plan.site, st.text, suffix)
	}
	if plan.exact && !adv.Simple {
		if err := c.checkUnlocks(adv, plan.keys, plan.site); err != nil {
			return plan, nil, err
		}
	}
	c.warnSelfWait(adv, plan.keys, plan.known, plan.site)
	hint, err := c.selfWaitAdvisory(ctx, func() string { return fmt.Sprintf("the statement %.120q", st.text) }, waitingKeys(adv, plan.keys, plan.known), nil)
	if err != nil {
		c.connector.events.add(eventSelfWait, err.Error())
		return plan, nil, err
	}
	plan.wait = c.startAdvisoryWait(ctx, adv, plan.keys, plan.known, plan.site)
	plan.wait.noteSelfHint(hint)
	if takesTurn(adv) && adv.Calls[0].Func == 0 {
		if key, ok := c.turnKey(plan); ok {
			if err := c.takeTurn(ctx, key); err != nil {
				plan.wait.end(ctx, "", err)
				return plan, nil, err
			}
			plan.turn = true
			c.noteSent(st.text) // sent now, after its wait in memory (pg_loss.go's quiet)
		}
	}
	c.pin.mu.Lock()
	c.pin.busy++
	c.pin.gen++
	c.pin.mu.Unlock()
	return plan, nil, nil
}

// integerArgs reports whether every argument is a value of one of Go's
// integer types that fits an int64: sent as text with its type left to
// the server (pgx's QueryExecModeExec, see annotatedLockText), such a
// value means what it meant in the driver's own mode, where a []byte, a
// time.Time or a value of the driver's own types need not.
func integerArgs(args []driver.NamedValue) bool {
	for _, a := range args {
		if _, isInt, fits := integerValue(a.Value); !isInt || !fits {
			return false
		}
	}
	return true
}

// keySlices returns an advisoryPlan's keys and known for n calls: for the
// usual statement of one call, in one allocation.
func keySlices(n int) ([]lockKey, []bool) {
	if n == 1 {
		one := new(struct {
			key   [1]lockKey
			known [1]bool
		})
		return one.key[:], one.known[:]
	}
	return make([]lockKey, n), make([]bool, n)
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
	switch dberr.SQLState(err) {
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
			lost := c.loseLocks(err)
			c.connector.pins.settle(c) // the monitor ends its backend
			return c.lostError(lost, err)
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
	span := trace.SpanContextFromContext(ctx)
	// lockhooks' own statements below run whether or not ctx ended
	// (context.WithoutCancel, made where one runs: it costs an
	// allocation).
	if err != nil {
		if c.connectionBroken(err) {
			c.endAfterBreak(plan)
			lost := c.loseLocks(err)
			c.connector.pins.settle(c) // the monitor ends its backend
			return c.lostError(lost, err)
		}
		// Any error on a statement that may have taken or released a lock
		// makes the server say what the backend holds now: a lock_timeout
		// (55P03), statement_timeout or cancel (57014) or deadlock (40P01)
		// racing the grant leaves the lock granted; a statement of several
		// calls may have run some of them. One read, on the error path
		// only. (Inside a transaction the error aborted it, the read fails,
		// and the connection is read once the transaction ends.)
		if len(adv.Calls) > 0 {
			inTx := c.inTx()
			switch rerr := c.reconcile(context.WithoutCancel(ctx), plan.site, nil, !adv.Simple || !plan.exact); {
			case rerr == nil:
			case c.connectionBroken(rerr):
				if lost := c.loseLocks(rerr); lost != nil {
					err = c.lostError(lost, err)
				}
			case !inTx:
				// (inside a transaction the read is made once it ends)
				c.markUnverified()
			}
		}
		c.loseIfReleased(plan.st.text) // (a statement of several calls may have run its unlock)
		c.connector.pins.settle(c)
		if c.connector.opts.txPooler {
			c.releaseHolder(context.WithoutCancel(ctx))
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
		pending = c.apply(span, plan, results)
	}
	if adv.Statements > 1 {
		c.followTxControl(plan.st.text, true, false)
	}
	var verr error
	if plan.verify || len(pending) > 0 {
		switch verr = c.reconcile(context.WithoutCancel(ctx), plan.site, pending, !plan.exact); {
		case errors.Is(verr, ErrTransactionPooler):
			// The statement ran on another backend than the connection's:
			// its locks cannot be trusted.
			c.markLost(verr.Error(), verr, lossReport|lossPooler) // not ours to end: other clients use that backend
		case verr != nil && c.connectionBroken(verr):
			verr = c.lostError(c.loseLocks(verr), verr)
		default:
			verr = nil // a failed read was logged; the next one catches up
		}
	}
	c.loseIfReleased(plan.st.text) // an AdvisoryLock's key released on its own connection
	c.connector.pins.settle(c)
	if c.connector.opts.txPooler {
		c.releaseHolder(context.WithoutCancel(ctx))
	}
	return verr
}

// endAfterBreak has the backend of a connection that broke during a
// statement taking locks ended, where it holds or awaits one of the keys the
// statement asked for: the server may have granted the lock as the
// connection broke, or grant it later to a backend whose client's side is
// gone (half-open), and nobody could unlock it. Only keys the statement
// named (a call whose key lockhooks could not resolve, in a DO block or a
// function, is left alone), and not through a pooler: there the holder's
// own failure does it (holderFailed), and an undeclared pooler's backend
// serves others.
func (c *conn) endAfterBreak(plan advisoryPlan) {
	if !c.endable() {
		return // (a pinning pooler may have run the statement on another backend than c.pid)
	}
	var keys []lockKey
	for i, call := range plan.st.advisory.Calls {
		if call.Func&(sqlscan.FnUnlock|sqlscan.FnUnlockAll) == 0 && i < len(plan.known) && plan.known[i] {
			keys = append(keys, plan.keys[i])
		}
	}
	if t := c.endTarget(); t.pid != 0 && len(keys) > 0 {
		c.connector.pins.ends.add(t, keys, false)
	}
}

// apply records the effect of a target list whose keys are all known, call
// by call, left to right (span: the statement's). It returns the try-locks
// whose outcome only pg_locks can tell (negative counts: transaction-level
// ones).
func (c *conn) apply(span trace.SpanContext, plan advisoryPlan, results []driver.Value) (pending map[lockKey]int) {
	adv := plan.st.advisory
	inTx := c.inTx()
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
					c.pin.xactSince, c.pin.xactSite = time.Now(), plan.site
					c.pin.xactPCs.Reset()
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
	c.transactionEnded() // COMMIT or ROLLBACK: the text does not say which took effect
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
		c.loseIfReleased("")
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
func (c *conn) addXact(keys []int64, site *callsite.Stack) {
	c.pin.mu.Lock()
	defer c.pin.mu.Unlock()
	if c.pin.xact == nil {
		c.pin.xact = make(map[lockKey]int)
		c.pin.xactSince, c.pin.xactSite, c.pin.xactPCs = time.Now(), "", *site
	}
	for _, k := range keys {
		c.pin.xact[lockKey{k1: k}]++
	}
	c.updateActiveLocked()
}

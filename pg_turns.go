package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Lock statements sent through the pool queue in memory, and the pool
// deadlock they could otherwise make.
//
// A `SELECT pg_advisory_lock(k)` that a connection of the pool sends waits
// on the server holding that connection. When k's holder is a parked
// connection of the same database (it took k and went back to the pool),
// the holder can only be released by an unlock sent through the pool too.
// If every connection of the pool is held by such waits, nobody can send
// it: the pool has deadlocked itself. Two things prevent that:
//
//   - Queueing: an exclusive session lock of one bigint key, sent as a
//     statement of its own, first takes the key's turn in the database's
//     in-process queue, the one AcquireAdvisoryLock's acquirers use. So one
//     connection per key per database waits on the server; the others wait
//     in memory, where a wait can be given up without the server. A
//     try-lock takes the turn if it is free, and is answered false without
//     the server otherwise, as TryAdvisoryLock is. Shared locks, pairs of
//     int4 keys, keys known only from pg_locks and statements of several
//     calls are not queued.
//   - Breaking: a wait in memory whose key's holder needs the pool to be
//     released (a parked connection, or an AcquireAdvisoryLock that has its
//     turn and waits for a connection) gives up with ErrPoolDeadlock as soon
//     as every connection of the pool is held by such waits (the *sql.DB's
//     own counts say so; lockhooks knows its *sql.DB once it opened it, or
//     once a lockhooks function was given it). Its connection then goes
//     back to the pool, where the unlock can have it.
//
// A connection owns a key's turn from its lock statement until it no
// longer holds the key (unlock, a rerouted unlock, a loss, its close).

// ErrPoolDeadlock is returned by a lock statement sent through the pool
// that would otherwise wait, holding its connection, for an advisory lock
// whose holder needs a connection of the same pool to be released, while
// every connection of the pool is held by such waits. Nothing was sent to
// the server for it: retry it, or, better, take the lock with
// [AcquireAdvisoryLock], which waits without holding a connection, or
// give the pool more connections (sql.DB.SetMaxOpenConns).
var ErrPoolDeadlock = errors.New("lockhooks: the pool would deadlock: every connection waits for an advisory lock whose holder needs a connection of the pool to be released")

// poolDeadlockPoll is how often a lock statement waiting in memory checks
// whether the pool has deadlocked.
const poolDeadlockPoll = 50 * time.Millisecond

// turnKey returns the key whose turn a lock statement takes before it is
// sent, if it takes one: a statement of one exclusive session lock (or
// try-lock) of a bigint key, known before it runs, on a connection that does not
// hold that key already (a held key stacks on the server at once) and that
// is not AcquireAdvisoryLock's own (which took the turn itself).
func (c *conn) turnKey(plan advisoryPlan) (int64, bool) {
	adv := plan.st.advisory
	if !takesTurn(adv) || !plan.Exact || len(plan.Keys) != 1 || !plan.Known[0] {
		return 0, false
	}
	k := plan.Keys[0]
	if k.Pair || k.Shared || c.acquiring.Load() || c.holds(k) {
		return 0, false
	}
	return k.K1, !c.pin.OwnsTurn(k.K1)
}

// takeTurn takes key's turn for c before its lock statement is sent,
// waiting in memory behind this database's other holders and waiters of
// key. The wait gives up with ErrPoolDeadlock when the pool deadlocks
// (see above), and with the context's error when ctx ends. On success the
// turn is c's until the statement's outcome is settled (settleTurn).
func (c *conn) takeTurn(ctx context.Context, key int64) error {
	turns := &c.connector.turns
	if turns.tryLock(ctx, key, c, nil, nil) {
		c.notePendingTurn(key)
		return nil
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go c.connector.pins.watchPoolDeadlock(wctx, stop, key, cancel)
	err := turns.lock(wctx, key, c, nil, nil, nil)
	if err == nil && c.connector.pins.IsClosed() {
		turns.unlock(key, c) // db.Close ran meanwhile: nothing is sent
		return fmt.Errorf("%w (advisory lock %s)", errDatabaseClosedWhileQueued, describeKey(key))
	}
	if err == nil {
		c.notePendingTurn(key)
		return nil
	}
	if cause := context.Cause(wctx); errors.Is(cause, ErrPoolDeadlock) || errors.Is(cause, errDatabaseClosedWhileQueued) {
		return cause
	}
	return explainTableWait(err, fmt.Sprintf("the lock statement of %v", c), "its turn behind another holder or waiter of this database", describeKey(key))
}

// errDatabaseClosedWhileQueued fails a lock statement that waited in
// memory for its turn when db.Close ran: it is never sent.
var errDatabaseClosedWhileQueued = errors.New("lockhooks: the database was closed while the lock statement waited for its turn; it was not sent")

// adoptTurn makes c the owner of key's turn, which from owned (an
// AdvisoryLock released while c still holds the key, stacked).
func (c *conn) adoptTurn(key int64, from any) {
	c.pin.Lock()
	defer c.pin.Unlock()
	if !c.connector.turns.handOver(key, from, c) {
		return
	}
	c.pin.AdoptTurnLocked(key)
	c.releaseTurnsLocked()
}

// notePendingTurn records that c took key's turn for a statement whose
// outcome is not settled yet.
func (c *conn) notePendingTurn(key int64) { c.pin.NotePendingTurn(key) }

// settleTurn settles the turn c took for its last lock statement: c keeps
// it while it holds the key, and gives it up otherwise (the statement
// failed, or was cancelled before the grant).
func (c *conn) settleTurn() {
	c.pin.Lock()
	defer c.pin.Unlock()
	if c.pin.SettlePendingTurnLocked() {
		c.releaseTurnsLocked()
	}
}

// releaseTurnsLocked gives up the turns of keys c no longer holds (all of
// them once it is closed); c.pin is locked (the turn table's mutex is a
// leaf). While what the backend holds is unknown (unverified), c keeps its
// turns: the server may hold the key.
func (c *conn) releaseTurnsLocked() { c.pin.ReleaseTurnsLocked(c.ReleaseTurn) }

// ReleaseTurn gives key's turn, which c owned, back to the database's
// queue.
func (c *conn) ReleaseTurn(key int64) { c.connector.turns.unlock(key, c) }

// noteDB records the *sql.DB that uses c, whose pool counts tell a
// deadlocked pool (the first one given wins: a connector serves one).
func (c *connector) noteDB(db *sql.DB) {
	if c != nil && db != nil {
		c.db.CompareAndSwap(nil, db)
	}
}

// watchPoolDeadlock polls, while a lock statement of c's waits in memory
// for key's turn, whether the pool has deadlocked; if so it cancels the
// wait with an ErrPoolDeadlock that names the key, its holder and the fix.
func (p *pinning) watchPoolDeadlock(ctx context.Context, stop <-chan struct{}, key int64, cancel context.CancelCauseFunc) {
	t := time.NewTicker(poolDeadlockPoll)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-p.Closing():
			cancel(fmt.Errorf("%w (advisory lock %s)", errDatabaseClosedWhileQueued, describeKey(key)))
			return
		case <-t.C:
		}
		if err := p.poolDeadlock(key); err != nil {
			cancel(err)
			return
		}
		if p.c.db.Load() == nil && time.Since(start) >= time.Second && p.unknownPoolWarned.CompareAndSwap(false, true) {
			// (once per database)
			p.c.opts.logger.Warn("lockhooks: a lock statement has waited 1s in memory for its turn; lockhooks cannot tell whether the pool is full, because it does not know the *sql.DB: should every connection of the pool wait for a lock whose holder is parked, nothing can release it. Open the database with lockhooks.Open or OpenDB (or give it to AcquireAdvisoryLock or DebugHandler once), so that such a wait gives way with ErrPoolDeadlock",
				"database", p.c.pool, "key", describeKey(key))
		}
	}
}

// poolDeadlock returns an error wrapping ErrPoolDeadlock if every
// connection of the database's pool is held by a lock statement waiting
// for a key whose holder needs the pool, and the pool may not grow; key is
// the waiter's own, named in the error.
func (p *pinning) poolDeadlock(key int64) error {
	db := p.c.db.Load()
	if db == nil {
		return nil // the pool's counts are unknown: nothing can be proven
	}
	s := db.Stats()
	if s.MaxOpenConnections <= 0 || s.InUse < s.MaxOpenConnections {
		return nil // the pool can open a connection for the unlock
	}
	stuck, holder := p.stuckWaits(key)
	if stuck < s.InUse {
		return nil // some connection in use may still come back
	}
	err := fmt.Errorf("%w: advisory lock %s is held by %s, and all %d connections of database %q (SetMaxOpenConns(%d)) wait for such locks; this lock statement was not sent and gives its connection back: take the lock with lockhooks.AcquireAdvisoryLock (it waits without holding a connection), or raise SetMaxOpenConns",
		ErrPoolDeadlock, describeKey(key), holder, s.InUse, p.c.pool, s.MaxOpenConnections)
	if now := monoNow(); now-p.deadlockLogged.Load() >= int64(time.Second) {
		// One line a second at most: under a load that keeps the pool
		// full, waits give way often.
		p.deadlockLogged.Store(now)
		p.c.opts.logger.Warn("lockhooks: the pool deadlocked; a waiting lock statement gives its connection up", "database", p.c.pool,
			"key", describeKey(key), "holder", holder, "connections", s.InUse, "error", err.Error())
	}
	p.c.events.Add(eventPoolDeadlock, err.Error())
	return err
}

// stuckWaits counts the database's connections that wait, in memory for a
// turn or on the server, for a key whose holder needs the pool to be
// released: a parked connection (its unlock comes through the pool), an
// AcquireAdvisoryLock whose turn came and that waits for a connection, or
// a connection that is itself so stuck (followed to a fixed point: A waits
// behind B, which waits behind a parked C). It also names the holder of
// key.
func (p *pinning) stuckWaits(key int64) (stuck int, holder string) {
	parked := map[int64]*conn{} // keys held by parked connections
	for _, h := range p.Snapshot() {
		h.pin.Lock()
		if h.pin.Parked && h.pin.Lost == nil {
			for k := range h.pin.Held {
				if !k.Pair {
					parked[k.K1] = h
				}
			}
		}
		h.pin.Unlock()
	}
	holder = "a holder that needs a connection of the pool"
	if h := parked[key]; h != nil {
		holder = fmt.Sprintf("%v, parked (its unlock needs a connection of the pool)", h)
	}
	type ownerState struct {
		parked, serverWait bool // a conn owner: parked; waiting on the server for its own turn's key
	}
	entries := p.c.turns.entriesNow()
	owners := make([]ownerState, len(entries))
	for i, e := range entries {
		switch o := e.owner.(type) {
		case *conn:
			o.pin.Lock()
			owners[i] = ownerState{parked: o.pin.Parked, serverWait: o.pin.AwaitsOnServerLocked(e.key)}
			o.pin.Unlock()
		case *AdvisoryLock:
			owners[i] = ownerState{parked: o.needsConn.Load()} // (needs the pool as a parked holder does)
		}
	}
	stuckConn := map[*conn]bool{}
	for changed := true; changed; {
		changed = false
		for i, e := range entries {
			oc, _ := e.owner.(*conn)
			blocked := parked[e.key] != nil || owners[i].parked || oc != nil && stuckConn[oc]
			if oc != nil && owners[i].serverWait && parked[e.key] != nil && !stuckConn[oc] {
				stuckConn[oc], changed = true, true // it waits on the server for a parked holder
			}
			if !blocked {
				continue
			}
			for _, w := range e.waiters {
				if wc, ok := w.(*conn); ok && !stuckConn[wc] {
					stuckConn[wc], changed = true, true
				}
			}
		}
	}
	return len(stuckConn), holder
}

// awaitsOnServer reports whether c owns key's turn for a lock statement
// that waits on the server (pending, in flight).
func (c *conn) awaitsOnServer(key int64) bool { return c.pin.AwaitsOnServer(key) }

// turnAhead returns the connection whose turn w waits for in memory, where
// that connection waits on the server for the key itself: w's holder is
// then whom the server names for it, and it is queued ahead of w (the
// model never names a waiter as a holder). nil otherwise.
func (c *connector) turnAhead(w *conn) *conn {
	if w == nil || c.pins == nil {
		return nil
	}
	for _, e := range c.turns.entriesNow() {
		o, ok := e.owner.(*conn)
		if !ok {
			continue
		}
		for _, x := range e.waiters {
			if x == any(w) && o.awaitsOnServer(e.key) {
				return o
			}
		}
	}
	return nil
}

// settleTurnAfter is afterTracked's part for a statement that took a turn.
func (c *conn) settleTurnAfter(plan advisoryPlan) {
	if plan.turn {
		c.settleTurn()
	}
}

// takesTurn reports whether a statement's plan may take a turn: one call
// of pg_advisory_lock or pg_try_advisory_lock (exclusive, session level);
// the cheap test before turnKey's.
func takesTurn(adv *sqlscan.Advisory) bool {
	return adv != nil && adv.Simple && adv.Calls[0].Func&^sqlscan.FnTry == 0
}

// monoBase is the origin of monoNow's readings (set once, never changed).
var monoBase = time.Now()

// monoNow reads the monotonic clock, in a form an atomic holds (a pool
// deadlock's last log, pinning.deadlockLogged).
func monoNow() int64 { return int64(time.Since(monoBase)) }

package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
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
//     back to the pool, where the unlock can have it. The guard is
//     pgsession.PoolGuard, over the queue as lockdb.DB.TurnQueue copies it.
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
var ErrPoolDeadlock = pgsession.ErrPoolDeadlock

// turnKey returns the key whose turn a lock statement takes before it is
// sent, if it takes one: a statement of one exclusive session lock (or
// try-lock) of a bigint key, known before it runs, on a connection that does not
// hold that key already (a held key stacks on the server at once) and that
// is not AcquireAdvisoryLock's own (which took the turn itself).
func (c *conn) turnKey(plan advisoryPlan) (int64, bool) {
	adv := plan.st.advisory
	if !stmtlocks.OneSessionLock(adv) || !plan.Exact || len(plan.Keys) != 1 || !plan.Known[0] {
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
	turns := &c.connector.Turns
	if turns.TryLock(key, c, takerOf(ctx, c, nil), nil) {
		c.notePendingTurn(key)
		return nil
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go c.connector.pins.guard.Watch(wctx, stop, key, cancel)
	err := turns.Lock(wctx, key, c, takerOf(wctx, c, nil), nil, nil)
	if err == nil && c.connector.pins.IsClosed() {
		turns.Unlock(key, c) // db.Close ran meanwhile: nothing is sent
		return fmt.Errorf("%w (advisory lock %s)", pgsession.ErrClosedWhileQueued, describeKey(key))
	}
	if err == nil {
		c.notePendingTurn(key)
		return nil
	}
	if cause := context.Cause(wctx); errors.Is(cause, ErrPoolDeadlock) || errors.Is(cause, pgsession.ErrClosedWhileQueued) {
		return cause
	}
	return explainTableWait(err, fmt.Sprintf("the lock statement of %v", c), "its turn behind another holder or waiter of this database", describeKey(key))
}

// adoptTurn makes c the owner of key's turn, which from owned (an
// AdvisoryLock released while c still holds the key, stacked).
func (c *conn) adoptTurn(key int64, from any) {
	c.pin.Lock()
	defer c.pin.Unlock()
	if !c.connector.Turns.HandOver(key, from, c) {
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
func (c *conn) ReleaseTurn(key int64) { c.connector.Turns.Unlock(key, c) }

// noteDB records the *sql.DB that uses c, whose pool counts tell a
// deadlocked pool (the first one given wins: a connector serves one).
func (c *connector) noteDB(db *sql.DB) {
	if c != nil && db != nil {
		c.sqlDB.CompareAndSwap(nil, db)
	}
}

// poolGuard returns the pool-deadlock guard of p's database: its pool's
// counts (once its *sql.DB is known: noteDB) and its queue of turns.
func (p *pinning) poolGuard() pgsession.PoolGuard[lockKey, *conn] {
	c := p.c
	return pgsession.PoolGuard[lockKey, *conn]{Registry: p.Registry, Pool: c.Pool, Describe: describeKey,
		Counts: func() (inUse, limit int, known bool) {
			db := c.sqlDB.Load()
			if db == nil {
				return 0, 0, false
			}
			s := db.Stats()
			return s.InUse, s.MaxOpenConnections, true
		},
		Turns:      c.TurnQueue,
		Deadlocked: func(msg string) { c.Events.Add(eventPoolDeadlock, msg) },
	}
}

// settleTurnAfter is afterTracked's part for a statement that took a turn.
func (c *conn) settleTurnAfter(plan advisoryPlan) {
	if plan.turn {
		c.settleTurn()
	}
}

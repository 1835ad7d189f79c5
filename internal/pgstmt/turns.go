package pgstmt

import (
	"context"
	"errors"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
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
//     as every connection of the pool is held by such waits (the pool's own
//     counts say so, pgsession.PoolGuard.Counts: the root's are its
//     *sql.DB's, known once it opened it, or once a lockhooks function was
//     given it). Its connection then goes
//     back to the pool, where the unlock can have it. The guard is
//     pgsession.PoolGuard (Database.Guard), over the queue as
//     lockdb.DB.TurnQueue copies it.
//
// A connection owns a key's turn from its lock statement until it no
// longer holds the key (unlock, a rerouted unlock, a loss, its close).

// turnKey returns the key whose turn a lock statement takes before it is
// sent, if it takes one: a statement of one exclusive session lock (or
// try-lock) of a bigint key, known before it runs, on a connection that
// does not hold that key already (a held key stacks on the server at
// once) and that is not AcquireAdvisoryLock's own (which took the turn
// itself).
func turnKey[C Conn[K], K advisorykey.Named](c C, plan *Plan[C, K]) (int64, bool) {
	adv := plan.St.Advisory
	if !stmtlocks.OneSessionLock(adv) || !plan.Exact || len(plan.Keys) != 1 || !plan.Known[0] {
		return 0, false
	}
	k := advisorykey.Key(plan.Keys[0])
	if k.Pair || k.Shared || c.Acquiring() || c.Pin().Holds(plan.Keys[0]) {
		return 0, false
	}
	return k.K1, !c.Pin().OwnsTurn(k.K1)
}

// takeTurn takes key's turn for c before its lock statement is sent,
// waiting in memory behind this database's other holders and waiters of
// key. The wait gives up with ErrPoolDeadlock when the pool deadlocks,
// and with the context's error when ctx ends. On success the turn is c's
// until the statement's outcome is settled (settleTurn).
func (db *Database[C, K]) takeTurn(ctx context.Context, c C, key int64) error {
	turns := &db.Turns
	if turns.TryLock(key, c, db.Taker(ctx, c), nil) {
		c.Pin().NotePendingTurn(key)
		return nil
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go db.Guard.Watch(wctx, stop, key, cancel)
	err := turns.Lock(wctx, key, c, db.Taker(wctx, c), nil, nil)
	if err == nil && db.Sessions.IsClosed() {
		turns.Unlock(key, c) // db.Close ran meanwhile: nothing is sent
		return fmt.Errorf("%w (advisory lock %s)", pgsession.ErrClosedWhileQueued, describe[K](key))
	}
	if err == nil {
		c.Pin().NotePendingTurn(key)
		return nil
	}
	if cause := context.Cause(wctx); errors.Is(cause, pgsession.ErrPoolDeadlock) || errors.Is(cause, pgsession.ErrClosedWhileQueued) {
		return cause
	}
	return db.ExplainWait(err, fmt.Sprintf("the lock statement of %v", c), "its turn behind another holder or waiter of this database", describe[K](key))
}

// settleTurn settles the turn c took for its last lock statement: c keeps
// it while it holds the key, and gives it up otherwise (the statement
// failed, or was cancelled before the grant).
func settleTurn[C Conn[K], K advisorykey.Named](c C) {
	pin := c.Pin()
	pin.Lock()
	defer pin.Unlock()
	if pin.SettlePendingTurnLocked() {
		pin.ReleaseTurnsLocked(c.ReleaseTurn)
	}
}

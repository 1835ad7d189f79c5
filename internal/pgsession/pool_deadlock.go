package pgsession

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// ErrPoolDeadlock is returned by a lock statement sent through the pool
// that would otherwise wait, holding its connection, for an advisory lock
// whose holder needs a connection of the same pool to be released, while
// every connection of the pool is held by such waits; the root exports it.
var ErrPoolDeadlock = errors.New("lockhooks: the pool would deadlock: every connection waits for an advisory lock whose holder needs a connection of the pool to be released")

// ErrClosedWhileQueued fails a lock statement that waited in memory for
// its turn when db.Close ran: it is never sent.
var ErrClosedWhileQueued = errors.New("lockhooks: the database was closed while the lock statement waited for its turn; it was not sent")

// PoolDeadlockPoll is how often a lock statement waiting in memory checks
// whether the pool has deadlocked.
const PoolDeadlockPoll = 50 * time.Millisecond

// Turn is one key's entry of a database's in-process queue of turns (see
// State's turns), as the pool-deadlock guard sees it: copied, so that the
// guard looks at it with other locks taken (the queue's mutex is a leaf).
type Turn[C comparable] struct {
	Key int64
	// Owner is the connection that owns the key's turn; the zero C when
	// the owner is not a connection.
	Owner C
	// NeedsPool: the owner, not a connection, waits for a connection of
	// the pool (an AdvisoryLock whose turn came), as a parked holder's
	// unlock does.
	NeedsPool bool
	// Waiters are the connections that wait for the turn, in queue order.
	Waiters []C
}

// PoolGuard is the pool-deadlock guard of one database. A lock statement
// sent through the pool waits on the server holding its connection; when
// the key's holder is a parked connection of the same database (its
// unlock comes through the pool too), and every connection of the pool is
// held by such waits, nobody can send the unlock: the pool has deadlocked
// itself. Lock statements of one bigint key queue in memory for the key's
// turn first, and the guard watches each such wait: it gives up with
// ErrPoolDeadlock as soon as every connection of the pool is held by a
// wait whose key's holder needs the pool to be released, so that its
// connection goes back to the pool, where the unlock can have it.
//
// Set its fields before the first Watch; it keeps when it last logged.
type PoolGuard[K NamedKey, C Member[K]] struct {
	// Registry is the database's: its parked holders, its logger, and the
	// db.Close that ends the waits.
	Registry *Registry[K, C]
	// Pool names the database in messages.
	Pool string
	// Counts returns the pool's connections in use and their limit
	// (database/sql's DBStats.InUse and MaxOpenConnections); known is
	// false while the pool is not known, and then nothing can be proven.
	Counts func() (inUse, limit int, known bool)
	// Turns copies the database's in-process queue of turns.
	Turns func() []Turn[C]
	// Deadlocked records a pool deadlock (its error's text) among the
	// database's events.
	Deadlocked func(msg string)
	// Describe names a key for messages.
	Describe func(key int64) string

	logged atomic.Int64 // when a deadlock was last logged (monoNow)
	warned atomic.Bool  // a wait in memory was logged as unprovable (the pool unknown)
}

// Watch polls, while a lock statement waits in memory for key's turn
// (until stop is closed or ctx ends), whether the pool has deadlocked; if
// so it cancels the wait with an ErrPoolDeadlock that names the key, its
// holder and the fix, and at db.Close with ErrClosedWhileQueued. A wait
// that goes on for a second while the pool is not known is logged, once
// per database.
func (g *PoolGuard[K, C]) Watch(ctx context.Context, stop <-chan struct{}, key int64, cancel context.CancelCauseFunc) {
	t := time.NewTicker(PoolDeadlockPoll)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-g.Registry.Closing():
			cancel(fmt.Errorf("%w (advisory lock %s)", ErrClosedWhileQueued, g.Describe(key)))
			return
		case <-t.C:
		}
		known, err := g.deadlock(key)
		if err != nil {
			cancel(err)
			return
		}
		if !known && time.Since(start) >= time.Second && g.warned.CompareAndSwap(false, true) {
			g.Registry.cfg.Logger.Warn("lockhooks: a lock statement has waited 1s in memory for its turn; lockhooks cannot tell whether the pool is full, because it does not know the *sql.DB: should every connection of the pool wait for a lock whose holder is parked, nothing can release it. Open the database with lockhooks.Open or OpenDB (or give it to AcquireAdvisoryLock or DebugHandler once), so that such a wait gives way with ErrPoolDeadlock",
				"database", g.Pool, "key", g.Describe(key))
		}
	}
}

// Deadlock returns an error wrapping ErrPoolDeadlock if every connection
// of the pool is held by a lock statement waiting for a key whose holder
// needs the pool, and the pool may not grow; key is the waiter's own,
// named in the error. A deadlock is logged once a second at most (under a
// load that keeps the pool full, waits give way often) and recorded among
// the database's events.
func (g *PoolGuard[K, C]) Deadlock(key int64) error {
	_, err := g.deadlock(key)
	return err
}

// deadlock is Deadlock, also reporting whether the pool's counts are
// known.
func (g *PoolGuard[K, C]) deadlock(key int64) (known bool, err error) {
	inUse, limit, known := g.Counts()
	if !known {
		return false, nil // the pool's counts are unknown: nothing can be proven
	}
	if limit <= 0 || inUse < limit {
		return true, nil // the pool can open a connection for the unlock
	}
	stuck, holder := g.stuckWaits(key)
	if stuck < inUse {
		return true, nil // some connection in use may still come back
	}
	err = fmt.Errorf("%w: advisory lock %s is held by %s, and all %d connections of database %q (SetMaxOpenConns(%d)) wait for such locks; this lock statement was not sent and gives its connection back: take the lock with lockhooks.AcquireAdvisoryLock (it waits without holding a connection), or raise SetMaxOpenConns",
		ErrPoolDeadlock, g.Describe(key), holder, inUse, g.Pool, limit)
	if now := monoNow(); now-g.logged.Load() >= int64(time.Second) {
		g.logged.Store(now)
		g.Registry.cfg.Logger.Warn("lockhooks: the pool deadlocked; a waiting lock statement gives its connection up", "database", g.Pool,
			"key", g.Describe(key), "holder", holder, "connections", inUse, "error", err.Error())
	}
	g.Deadlocked(err.Error())
	return true, err
}

// stuckWaits counts the database's connections that wait, in memory for a
// turn or on the server, for a key whose holder needs the pool to be
// released: a parked connection (its unlock comes through the pool), an
// owner of a turn that waits for a connection (Turn.NeedsPool), or a
// connection that is itself so stuck (followed to a fixed point: A waits
// behind B, which waits behind a parked C). It also names the holder of
// key.
func (g *PoolGuard[K, C]) stuckWaits(key int64) (stuck int, holder string) {
	parked := map[int64]C{} // keys held by parked connections
	for _, h := range g.Registry.Snapshot() {
		s := h.Session()
		s.Lock()
		if s.Parked && s.Lost == nil {
			for k := range s.Held {
				if ak := advisorykey.Key(k); !ak.Pair {
					parked[ak.K1] = h
				}
			}
		}
		s.Unlock()
	}
	holder = "a holder that needs a connection of the pool"
	if h, ok := parked[key]; ok {
		holder = fmt.Sprintf("%v, parked (its unlock needs a connection of the pool)", h)
	}
	type ownerState struct {
		conn       bool // the owner is a connection
		parked     bool // a connection owner: parked; another: it needs the pool
		serverWait bool // a connection owner waits on the server for its own turn's key
	}
	var none C
	turns := g.Turns()
	owners := make([]ownerState, len(turns))
	for i, e := range turns {
		if e.Owner == none {
			owners[i] = ownerState{parked: e.NeedsPool}
			continue
		}
		s := e.Owner.Session()
		s.Lock()
		owners[i] = ownerState{conn: true, parked: s.Parked, serverWait: s.AwaitsOnServerLocked(e.Key)}
		s.Unlock()
	}
	stuckConn := map[C]bool{}
	for changed := true; changed; {
		changed = false
		for i, e := range turns {
			_, heldParked := parked[e.Key]
			o := owners[i]
			blocked := heldParked || o.parked || o.conn && stuckConn[e.Owner]
			if o.conn && o.serverWait && heldParked && !stuckConn[e.Owner] {
				stuckConn[e.Owner], changed = true, true // it waits on the server for a parked holder
			}
			if !blocked {
				continue
			}
			for _, w := range e.Waiters {
				if !stuckConn[w] {
					stuckConn[w], changed = true, true
				}
			}
		}
	}
	return len(stuckConn), holder
}

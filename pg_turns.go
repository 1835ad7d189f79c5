package lockhooks

import (
	"database/sql"

	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// Lock statements sent through the pool queue in memory, so that the pool
// cannot deadlock itself on them: see internal/pgstmt's turns.go. What
// stays here is the connection's side of the turns and the guard's view
// of the *sql.DB.

// ErrPoolDeadlock is returned by a lock statement sent through the pool
// that would otherwise wait, holding its connection, for an advisory lock
// whose holder needs a connection of the same pool to be released, while
// every connection of the pool is held by such waits. Nothing was sent to
// the server for it: retry it, or, better, take the lock with
// [AcquireAdvisoryLock], which waits without holding a connection, or
// give the pool more connections (sql.DB.SetMaxOpenConns).
var ErrPoolDeadlock = pgsession.ErrPoolDeadlock

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

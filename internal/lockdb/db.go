package lockdb

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/keynames"
	"github.com/lockhooks/lockhooks/internal/pgblocking"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// Conn is one connection of a database, the adapter's own type (a
// pointer): a holder as internal/holding reads it, a connection the reader
// of who blocks whom matches backends to, a waiter of the waits in
// progress and a member of the session-lock registry, whose session-lock
// tracking is Pin.
type Conn[K pgsession.NamedKey] interface {
	holding.Conn[K]
	pgblocking.Conn
	waits.Waiter
	pgsession.Member[K]
	// Pin is the connection's session-lock tracking (Postgres).
	Pin() *pgsession.Conn[K]
}

// DB is one lockhooks database. The adapter fills its exported fields
// when it opens the database, before any connection opens, and embeds it;
// the lock tables are used in place. Every field is required but
// Sessions, which is nil on SQLite.
type DB[C Conn[K], K pgsession.NamedKey] struct {
	// Dialect is the engine as the page names it ("postgres", "sqlite").
	Dialect string
	// Pool is the database's pool name, settled when it joins the
	// process's registry of databases.
	Pool string

	// Named is SQLite's in-process advisory locks; Turns, on Postgres, the
	// in-process queue of each advisory key (AcquireAdvisoryLock's and lock
	// statements' turns); Locksets, SQLite's Lock/TryLock ids.
	Named, Turns inprocess.Table[int64]
	Locksets     inprocess.Table[inprocess.LocksetKey]
	// Writer is SQLite's in-process writer lock (the adapter's; on
	// Postgres one nobody takes).
	Writer *inprocess.Writer

	// Events is the database's recent events; Waits its waits in progress.
	Events *holders.Events
	Waits  *waits.Watch[C, K]
	// Sessions is the registry of connections that hold session locks
	// (Postgres; nil on SQLite, and how the database tells its engine);
	// Blocking is the reader of who blocks whom among its connections on
	// the database's side connection (set on both engines, asked to read
	// only on Postgres).
	Sessions *pgsession.Registry[K, C]
	Blocking *pgblocking.Reader[C]

	// Names is the process's memory of the names advisory keys were made
	// from.
	Names *keynames.Memory
	// OwnerConn is the connection of a lock table's owner, or C's zero
	// value.
	OwnerConn func(owner any) C
	// NeedsConn reports whether an owner of a turn that is not a
	// connection waits for a connection of the pool (AcquireAdvisoryLock's
	// lock, before it has one).
	NeedsConn func(owner any) bool
	// Identify names a backend the server showed blocking a wait for keys
	// as the holder it is, where it is a connection of a lockhooks
	// database of this process or another (ok false: nobody knows it).
	Identify func(s holders.Blocker, keys []K) (h holders.Holder, ok bool)

	liveMu sync.RWMutex   // read: Conns, the self-wait scan
	live   map[C]struct{} // every open connection

	tablesOnce sync.Once
	tables     inprocess.Tables // the lock tables as Edges reads them, made once
	owners     inprocess.Owners // OwnerHolder, as Edges names owners
}

// Opened adds c to the database's open connections.
func (db *DB[C, K]) Opened(c C) {
	db.liveMu.Lock()
	if db.live == nil {
		db.live = make(map[C]struct{})
	}
	db.live[c] = struct{}{}
	db.liveMu.Unlock()
}

// Closed removes c from the open connections.
func (db *DB[C, K]) Closed(c C) {
	db.liveMu.Lock()
	delete(db.live, c)
	db.liveMu.Unlock()
}

// Conns returns every open connection, in no order.
func (db *DB[C, K]) Conns() []C {
	db.liveMu.RLock()
	defer db.liveMu.RUnlock()
	return slices.Collect(maps.Keys(db.live))
}

// ConnByID returns the open connection numbered id.
func (db *DB[C, K]) ConnByID(id uint64) (C, bool) {
	db.liveMu.RLock()
	defer db.liveMu.RUnlock()
	for c := range db.live {
		if c.ID() == id {
			return c, true
		}
	}
	var none C
	return none, false
}

// SelfWait returns the other open connection whose transaction belongs to
// the call chain of self's waiter (holding.SelfWait), and whether that is
// certain; found is false when there is none.
func (db *DB[C, K]) SelfWait(ctx context.Context, self C) (h C, found, certain bool) {
	db.liveMu.RLock()
	defer db.liveMu.RUnlock()
	return holding.SelfWait(ctx, self, db.live)
}

// postgres reports whether the database tracks session locks.
func (db *DB[C, K]) postgres() bool { return db.Sessions != nil }

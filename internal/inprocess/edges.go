package inprocess

import (
	"sort"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// LocksetKey is one id of Lock's in a table: its namespace and its
// canonical id (lockset).
type LocksetKey struct {
	Namespace string
	ID        string // canonical
}

// Tables is a database's in-process locks, as Edges reads them.
type Tables struct {
	Named    *Table[int64]      // SQLite's advisory locks
	Turns    *Table[int64]      // Postgres: the turns of advisory keys (AcquireAdvisoryLock's queue, and lock statements')
	Locksets *Table[LocksetKey] // SQLite: Lock's ids
	Writer   *Writer            // SQLite: the writer lock
	// AwaitsOnServer reports whether a turn's owner waits on the server
	// itself for key: its holder is then whom the server names for it, and
	// its waiters are queued behind it.
	AwaitsOnServer func(owner any, key int64) bool
	// DescribeKey names an advisory key for a reader.
	DescribeKey func(key int64) string
}

// Edge is one in-process wait: Waiter (an owner) waits for a lock Holder
// holds, in one of the database's lock tables or at its writer lock.
type Edge struct {
	Kind       string // advisory | lockset | sqlite_writer
	Waiter     any    // the waiting owner
	Since      time.Time
	WaiterSite string // where the waiter asked
	Holder     holders.Holder
}

// Edges lists who waits for whom in the in-process locks, oldest wait
// first, naming owners with o: SQLite's advisory locks, the turns of
// Postgres advisory keys (not where the turn's owner waits on the server
// itself), locksets and the writer lock.
func (t Tables) Edges(o Owners) []Edge {
	var out []Edge
	sites := SiteNames{} // many waiters share a call site: symbolise each once
	named := func(key int64, h Holder, w sqlitelock.Waiting) {
		out = append(out, Edge{Kind: "advisory", Waiter: w.Owner, Since: w.Since, WaiterSite: sites.Of(&w.Site),
			Holder: o.Holder(t.DescribeKey(key), h, sites)})
	}
	t.Named.Waits(named)
	t.Turns.Waits(func(key int64, h Holder, w sqlitelock.Waiting) {
		if t.AwaitsOnServer(h.Owner, key) {
			return // the turn's owner waits itself: the key's holder is whom the server names for it
		}
		named(key, h, w)
	})
	t.Locksets.Waits(func(key LocksetKey, h Holder, w sqlitelock.Waiting) {
		out = append(out, Edge{Kind: "lockset", Waiter: w.Owner, Since: w.Since, WaiterSite: sites.Of(&w.Site),
			Holder: o.Holder(KeyName(key.Namespace, lockset.DescribeID(key.ID)), h, sites)})
	})
	WriterWaits(t.Writer, func(h WriterHolder, w WriterWaiter) {
		out = append(out, Edge{Kind: "sqlite_writer", Waiter: w.Owner, Since: w.Since, WaiterSite: w.Where, Holder: h.Identity(o)})
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out
}

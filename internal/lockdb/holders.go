package lockdb

import (
	"context"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// HoldersOf finds who holds what the wait v waits for: in-process holders
// from the lock tables and the session-lock tracking and, on Postgres,
// the backends pg_blocking_pids names, followed to the root of the chain,
// each identified where it is a connection of a lockhooks database (of
// this process or another), or, for a wait that does not wait on the
// server (through a transaction pooler lockhooks polls), the backends
// pg_locks shows holding its advisory keys.
func (db *DB[C, K]) HoldersOf(ctx context.Context, v waits.View[C, K]) *holders.Blockage {
	var none C
	b := &holders.Blockage{Holders: db.InProcessHolders(v, db.Edges()), At: time.Now()}
	if !db.postgres() || v.Waiter == none || v.Waiter.PID() == 0 {
		return b
	}
	ahead := db.TurnAhead(v.Waiter)
	asked := []C{v.Waiter}
	if ahead != none {
		asked = append(asked, ahead)
	}
	blocked, err := db.Blocking.Blocked(ctx, asked)
	bb := blocked[v.Waiter]
	if bb == nil && ahead != none && blocked[ahead] != nil {
		bb = blocked[ahead].BehindInMemory()
	}
	switch {
	case err != nil:
		b.Err = err
	case bb != nil:
		db.AddBlockers(b, bb.Blockers, v.AdvKeys)
		b.Queued = bb.QueuedAhead
	case len(b.Holders) == 0 && len(v.AdvKeys) > 0:
		db.AddBlockers(b, db.KeyHolders(ctx, v.Waiter, v.AdvKeys), v.AdvKeys)
	}
	return b // otherwise not waiting on the server (an in-process queue)
}

// InProcessHolders returns the holders in this process of what v waits
// for: from the lock tables' edges, and from the session-lock tracking.
func (db *DB[C, K]) InProcessHolders(v waits.View[C, K], edges []inprocess.Edge) []holders.Holder {
	var none C
	out := []holders.Holder{}
	if v.Waiter == none {
		return out
	}
	for _, e := range edges {
		if db.OwnerConn(e.Waiter) == v.Waiter {
			out = append(out, e.Holder)
		}
	}
	if db.postgres() {
		for _, k := range v.AdvKeys {
			out = append(out, holding.Among(db.Sessions.Snapshot(), k, v.Waiter)...)
		}
	}
	return out
}

// Edges lists who waits for whom in the database's in-process locks
// (inprocess.Tables.Edges).
func (db *DB[C, K]) Edges() []inprocess.Edge {
	db.tablesOnce.Do(func() { // (once: the function values would cost allocations on every call)
		db.tables = inprocess.Tables{Named: &db.Named, Turns: &db.Turns, Locksets: &db.Locksets, Writer: db.Writer, DescribeKey: db.Names.Describe,
			AwaitsOnServer: func(owner any, key int64) bool {
				o, ok := owner.(C)
				return ok && o.Pin().AwaitsOnServer(key)
			}}
		db.owners = db.OwnerHolder
	})
	return db.tables.Edges(db.owners)
}

// OwnerHolder names a lock table's owner as a holder (inprocess.Owners):
// its connection's identity, without what it holds.
func (db *DB[C, K]) OwnerHolder(owner any) holders.Holder {
	var none C
	if c := db.OwnerConn(owner); c != none {
		return c.Identity()
	}
	return holders.Holder{}
}

// TurnAhead returns the connection whose turn w waits for in memory, where
// that connection waits on the server for the key itself: w's holder is
// then whom the server names for it, and it is queued ahead of w (the
// model never names a waiter as a holder). C's zero value otherwise.
func (db *DB[C, K]) TurnAhead(w C) C {
	var none C
	if w == none || !db.postgres() {
		return none
	}
	for _, e := range db.Turns.Entries() {
		o, ok := e.Owner.(C)
		if !ok {
			continue
		}
		for _, x := range e.Waiters {
			if x == any(w) && o.Pin().AwaitsOnServer(e.Key) {
				return o
			}
		}
	}
	return none
}

// TurnQueue copies the queue of turns for the pool-deadlock guard: the owner
// and waiters that are connections, and whether an owner that is not one
// waits for a connection of the pool (NeedsConn).
func (db *DB[C, K]) TurnQueue() []pgsession.Turn[C] {
	entries := db.Turns.Entries()
	out := make([]pgsession.Turn[C], len(entries))
	for i, e := range entries {
		t := pgsession.Turn[C]{Key: e.Key}
		if o, ok := e.Owner.(C); ok {
			t.Owner = o
		} else {
			t.NeedsPool = db.NeedsConn(e.Owner)
		}
		for _, w := range e.Waiters {
			if wc, ok := w.(C); ok {
				t.Waiters = append(t.Waiters, wc)
			}
		}
		out[i] = t
	}
	return out
}

// KeyHolders returns the backends other than waiter's that hold the
// advisory keys now (pgblocking.Reader.KeyHolders).
func (db *DB[C, K]) KeyHolders(ctx context.Context, waiter C, keys []K) []holders.Blocker {
	return db.Blocking.KeyHolders(ctx, waiter.Identity().PID, pgsession.CoreKeys(keys))
}

// AddBlockers adds to b the backends Postgres showed blocking a wait for
// keys, each identified as a holder where it is a connection of a
// lockhooks database (Identify).
func (db *DB[C, K]) AddBlockers(b *holders.Blockage, server []holders.Blocker, keys []K) {
	b.Add(server, func(s holders.Blocker) (holders.Holder, bool) { return db.Identify(s, keys) })
}

// modeOf is a key's mode as the page names it.
func modeOf[K advisorykey.Typed](k K) string {
	if advisorykey.Key(k).Shared {
		return "shared"
	}
	return "exclusive"
}

package holders

import (
	"strconv"
	"sync"
)

// MaxDatabases bounds a Databases registry. A database opened beyond it
// works as any other, but waiters of other databases cannot name its
// connections.
const MaxDatabases = 1024

// Databases is the set of lockhooks databases open in a process, in the
// order they were opened: each numbered and named when it joins, so that
// a waiter in one can be told its holder is a connection of another. D is
// the caller's database. It is safe for concurrent use.
type Databases[D comparable] struct {
	mu   sync.RWMutex
	dbs  []openDatabase[D]
	next uint64 // the number of the last database that joined
}

// openDatabase is one listed database and its pool name.
type openDatabase[D comparable] struct {
	db   D
	pool string
}

// Join numbers d (seq: 1 for the registry's first database, then in the
// order they joined) and settles its pool name: name itself when the user
// gave it (explicit; clash reports that an open database has it too), or
// the default name made unique among the open databases by a "#2", "#3"…
// suffix (two *sql.DB on one DSN are two pools; their gauges must not
// share one attribute set). named is given the number and the name before
// d is listed, so that whoever lists d sees them set: it runs under the
// registry's lock, and must only record them. Join lists d unless
// MaxDatabases are listed.
func (r *Databases[D]) Join(d D, name string, explicit bool, named func(seq uint64, pool string)) (clash bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	pool := name
	taken := func(name string) bool {
		for _, o := range r.dbs {
			if o.pool == name {
				return true
			}
		}
		return false
	}
	if explicit {
		clash = taken(pool)
	} else {
		for n := 2; taken(pool); n++ {
			pool = name + "#" + strconv.Itoa(n)
		}
	}
	named(r.next, pool)
	if len(r.dbs) < MaxDatabases {
		r.dbs = append(r.dbs, openDatabase[D]{db: d, pool: pool})
	}
	return clash
}

// Leave forgets d (closed).
func (r *Databases[D]) Leave(d D) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, o := range r.dbs {
		if o.db == d {
			r.dbs = append(r.dbs[:i], r.dbs[i+1:]...)
			return
		}
	}
}

// List returns the open databases, in the order they joined.
func (r *Databases[D]) List() []D {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]D, len(r.dbs))
	for i, o := range r.dbs {
		out[i] = o.db
	}
	return out
}

package lockhooks

// The process's lockhooks databases: each joins when opened and leaves when
// closed, so that a waiter in one can be told its holder is a connection of
// another (same server), found by backend pid and what it published.

import (
	"strconv"
	"sync"
)

// maxDatabases bounds the registry. A database opened beyond it works as
// any other, but waiters of other databases cannot name its connections.
const maxDatabases = 1024

// registry is the set of lockhooks databases open in this process:
// lockhooks' one piece of process-wide state besides the driver names
// sql.Register keeps. It holds each database from Open to Close (an
// unclosed *sql.DB is never freed anyway: its pool's goroutine keeps it),
// at most maxDatabases of them.
type registry struct {
	mu   sync.RWMutex
	dbs  []*connector
	next uint64 // the number of the last database opened (connector.seq)
}

// databases is the process's registry.
var databases registry

// join registers c, numbers it and settles its pool name: the one WithPoolName gave,
// or its default, made unique among the open databases by a "#2", "#3"…
// suffix (two *sql.DB on one DSN are two pools; their gauges must not
// share one attribute set).
func (r *registry) join(c *connector, defaultName string) {
	r.mu.Lock()
	clash := false
	defer func() {
		r.mu.Unlock()
		if clash { // the user's logger runs outside the registry's lock
			c.opts.logger.Warn("lockhooks: two open databases have the same pool name (WithPoolName); their gauges and the holders they name cannot be told apart",
				"pool", c.pool)
		}
	}()
	r.next++
	c.seq = r.next
	taken := func(name string) bool {
		for _, o := range r.dbs {
			if o.pool == name {
				return true
			}
		}
		return false
	}
	if c.opts.poolName != "" {
		c.pool = c.opts.poolName
		clash = taken(c.pool)
	} else {
		c.pool = defaultName
		for n := 2; taken(c.pool); n++ {
			c.pool = defaultName + "#" + strconv.Itoa(n)
		}
	}
	if len(r.dbs) < maxDatabases {
		r.dbs = append(r.dbs, c)
		c.joined = true
	}
}

// leave forgets c (db.Close).
func (r *registry) leave(c *connector) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, o := range r.dbs {
		if o == c {
			r.dbs = append(r.dbs[:i], r.dbs[i+1:]...)
			return
		}
	}
}

// list returns the open databases.
func (r *registry) list() []*connector {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]*connector(nil), r.dbs...)
}

// connOf returns the connection of any open Postgres database of the
// process whose statements backend pid runs, as pg_stat_activity shows
// the backend (its application_name app and last statement query) to
// database seenBy, or nil (see connector.backendConn). Pids are per
// server: a backend that shows no identity is matched only to connections
// of seenBy and of databases known to be on the same server.
func (r *registry) connOf(pid int32, app, query string, seenBy *connector) *conn {
	if pid == 0 {
		return nil
	}
	for _, c := range r.list() {
		if c.opts.dialect != Postgres {
			continue
		}
		if oc := c.backendConn(pid, app, query, c.index(), sameServer(c, seenBy)); oc != nil {
			return oc
		}
	}
	return nil
}

// sameServer reports whether databases a and b are known to reach the
// same Postgres server, where a backend pid names the same backend.
func sameServer(a, b *connector) bool {
	if a == b {
		return a != nil
	}
	if a == nil || b == nil {
		return false
	}
	sa, sb := a.server.Load(), b.server.Load()
	return sa != nil && sb != nil && *sa != "" && *sa == *sb
}

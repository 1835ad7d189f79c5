package lockhooks

import "github.com/lockhooks/lockhooks/internal/holders"

// The process's lockhooks databases: each joins when opened and leaves when
// closed, so that a waiter in one can be told its holder is a connection of
// another (same server), found by backend pid and what it published.

// databases is the process's lockhooks databases (holders.Databases):
// lockhooks' one piece of process-wide state besides the driver names
// sql.Register keeps and LockID's memory of names. It holds each database
// from Open to Close (an unclosed *sql.DB is never freed anyway: its
// pool's goroutine keeps it), at most holders.MaxDatabases of them.
var databases registry

// registry is the process's databases, and the lookup of a backend's
// connection among them.
type registry struct{ holders.Databases[*connector] }

// join registers c, numbers it and settles its pool name: the one
// WithPoolName gave, or its default, made unique among the open databases
// (see holders.Databases.Join).
func (r *registry) join(c *connector, defaultName string) {
	name, explicit := defaultName, c.opts.poolName != ""
	if explicit {
		name = c.opts.poolName
	}
	clash := r.Join(c, name, explicit, func(seq uint64, pool string) { c.seq, c.Pool = seq, pool })
	if clash { // (the user's logger runs outside the registry's lock)
		c.opts.logger.Warn("lockhooks: two open databases have the same pool name (WithPoolName); their gauges and the holders they name cannot be told apart",
			"pool", c.Pool)
	}
}

// connOf returns the connection of any open Postgres database of the
// process whose statements backend pid runs, as pg_stat_activity shows
// the backend (its application_name app and last statement query) to
// database seenBy, or nil (see pgblocking.Reader.ConnOf). Pids are per
// server: a backend that shows no identity is matched only to connections
// of seenBy and of databases known to be on the same server.
func (r *registry) connOf(pid int32, app, query string, seenBy *connector) *conn {
	if pid == 0 {
		return nil
	}
	for _, c := range r.List() {
		if c.opts.dialect != Postgres {
			continue
		}
		if oc, ok := c.Blocking.ConnOf(pid, app, query, sameServer(c, seenBy)); ok {
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

package pgsession

import (
	"sync"
	"sync/atomic"
)

// Conn is what one Postgres connection keeps for session-lock tracking:
// the state of its advisory locks, the backend it reached at connect, its
// last round trips, and the holder that keeps its session locks through a
// declared transaction pooler. The caller's connection holds one Conn, by
// value, from Connect to Close. PID and Hold's pid are read by other
// goroutines (atomics); State and Trips guard themselves. ReachesServer
// and Incarnation are written when the connection opens, before any other
// goroutine can see it (Incarnation may instead be read with the first
// later read of the pid, on a connection whose ReachesServer stays false:
// nothing reads it then, since only an Endable connection's is).
type Conn[K NamedKey] struct {
	// State is its advisory locks; its mutex is what the caller calls the
	// connection's pin mutex.
	State[K]

	// Exec serialises what lockhooks itself runs on a connection that
	// database/sql no longer uses (a parked one): rerouted unlocks, reads
	// of pg_locks, Close. It is taken before State's mutex, after the
	// registry's.
	Exec sync.Mutex

	// PID is the backend pid, read when the connection opens (0 until
	// then); other goroutines read it.
	PID atomic.Int32

	// Incarnation names PID's backend among all that had its pid (see
	// IncarnationExpr), read with it; "" when the server could not tell
	// (then lockhooks never ends the backend: see EndBackend).
	Incarnation string

	// ReachesServer: the process id the server sent at connect is
	// pg_backend_pid()'s (pgx, or lib/pq), so no pooler stands between the
	// connection and its backend, whatever the options say; only then may
	// lockhooks end that backend after a loss (the package's rule).
	ReachesServer bool

	// Trips are when the connection last sent a statement that lockhooks
	// follows and last had one answered, for ending its backend after a
	// loss only if nobody else ran on it since (EndTarget).
	Trips RoundTrips

	// Hold keeps the session locks in transaction-pooler mode; its PID is
	// read by other goroutines.
	Hold TxHolder

	// Who is the connection's identity as other processes see it.
	Who Identity

	// Discards counts DISCARD ALLs: the server forgot the driver's
	// prepared statements, so the connection is not pooled again, and
	// lockhooks' own texts change (AfterDiscard).
	Discards atomic.Int32

	// plainRead is its pg_locks read that does not change with what it
	// holds (OwnLocksQuery); guarded by State's mutex.
	plainRead plainRead

	set  *Settings // its database's (Init)
	host Host[K]   // the caller's connection (Init)
}

// LockPID returns the backend pid whose pg_locks rows are the
// connection's session locks: its holder's in transaction-pooler mode.
func (c *Conn[K]) LockPID() int32 {
	if pid := c.Hold.PID(); pid != 0 {
		return pid
	}
	return c.PID.Load()
}

// Endable reports whether lockhooks may end the connection's backend
// after a loss, the first point of the package's rule: it reached the
// server itself and no pooler stands between (throughPooler: one is
// declared, or was seen). Whoever asks for an end (EndTarget,
// EndQueue.Add) checks it first.
func (c *Conn[K]) Endable(throughPooler bool) bool { return c.ReachesServer && !throughPooler }

// EndTarget is the end request's target for the connection's own backend,
// as of now (RoundTrips.Target); the caller has checked Endable.
func (c *Conn[K]) EndTarget() EndTarget { return c.Trips.Target(c.PID.Load(), c.Incarnation) }

// XactKeysLocked returns the transaction-level locks the connection's
// transaction took, as far as lockhooks saw (State.Xact); State is locked.
func (c *Conn[K]) XactKeysLocked() []K {
	var keys []K
	for k, n := range c.Xact {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

// LostChan returns the channel closed when the connection's locks are
// lost.
func (s *State[K]) LostChan() <-chan struct{} {
	s.Lock()
	defer s.Unlock()
	if s.LostCh == nil {
		s.LostCh = make(chan struct{})
	}
	return s.LostCh
}

package pgstmt

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/lockdb"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// Conn is one connection of a database, the adapter's own type (a
// pointer), as a statement's plan uses it: a connection of the database
// as the core sees it (lockdb.Conn), the host of its session-lock
// tracking (pgsession.Host), and what only the adapter knows of it.
type Conn[K advisorykey.Named] interface {
	lockdb.Conn[K]
	pgsession.Host[K]
	// Direct reports whether the connection reaches the server itself (no
	// pooler between, and not in a simple protocol the user chose): its
	// statements then run on its own backend, always, so an exact
	// session-lock statement needs no pg_locks read after it
	// (pgsession.Conn.LockText).
	Direct() bool
	// Site is where the application sent a statement run with ctx.
	Site(ctx context.Context) string
	// EvalKey resolves a call's key by asking the server to evaluate its
	// arguments, where they are expressions; ok is false when it could
	// not (the key then has only the call's mode and kind).
	EvalKey(ctx context.Context, call sqlscan.AdvisoryCall, args []driver.NamedValue) (k K, ok bool)
	// TookInTx notes, in the connection's open transaction if it has
	// one, that it took row locks (row) or transaction-level locks just
	// now.
	TookInTx(row bool)
}

// Database is what the statements of one database share: the database
// as the core sees it, and what the adapter adds. The adapter fills it
// when it opens the database, before any connection opens; every field
// is required, but Guard and Reroute, which are nil on SQLite (where none
// of its methods is called: the statements it plans are Postgres's).
type Database[C Conn[K], K advisorykey.Named] struct {
	*lockdb.DB[C, K]
	// Guard gives a lock statement's wait for its key's turn up when the
	// pool deadlocks (pgsession.PoolGuard).
	Guard *pgsession.PoolGuard[K, C]
	// Telemetry is the database's spans and metrics; Outcomes classifies
	// the errors of lock acquisitions.
	Telemetry *telemetry.Set
	Outcomes  telemetry.Outcomes
	// Reroute runs an unlock of k, which from does not hold, on the
	// connection of the database that holds it, parked; it fails with an
	// error wrapping pgsession.ErrNotLockOwner where none can run it.
	Reroute func(ctx context.Context, from C, k K) error
	// Taker describes the caller taking a lock of the in-process tables
	// for owner with ctx.
	Taker func(ctx context.Context, owner any) inprocess.Taker
	// ExplainWait adds to the error of a wait in an in-process table who
	// it waited behind (inprocess.Owners.ExplainWait, with the adapter's
	// owners).
	ExplainWait func(err error, waiter, what, key string) error
	// Others returns the holders of this process on the other sides of
	// the deadlock err reports, if it reports one (called only with an
	// error).
	Others func(err error) []holders.Holder
}

// Statement is what the scanner found in a statement's text, as its plan
// reads it.
type Statement struct {
	// Text is the statement's text as it runs (rewritten, where lockhooks
	// rewrote its row-locking clause).
	Text string
	// Advisory is its advisory-lock calls (Postgres), nil if none.
	Advisory *sqlscan.Advisory
	// Locks is its row-locking clauses, as given.
	Locks sqlscan.LockInfo
	// RowLock: it takes Postgres row locks, so it is timed as a lock wait.
	RowLock bool
	// Rewrote: FOR UPDATE became FOR NO KEY UPDATE.
	Rewrote bool
}

// endable reports whether lockhooks may end or cancel c's backend: it
// reached the server itself and no pooler stands between (the rule of
// internal/pgsession, pgsession.Conn.Endable).
func endable[C Conn[K], K advisorykey.Named](c C) bool {
	return c.Pin().Endable(c.ThroughPooler())
}

// describe formats a bigint key for a reader, as K names it.
func describe[K advisorykey.Named](key int64) string { return K(advisorykey.Key{K1: key}).String() }

package pgsession

import (
	"context"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// Settings are what a database's options say to its connections'
// session-lock tracking; the caller keeps one per database, unchanged
// once its connections use it (Conn.Init).
type Settings struct {
	CheckTimeout  time.Duration // bounds one read of pg_locks, or one check of a parked connection
	TxPooler      bool          // WithTransactionPooler
	PinningPooler bool          // WithSessionPinningPooler
	Logger        *slog.Logger
	// Own says which of lockhooks' own statements the database's driver
	// runs uncached (the annotated pg_locks read).
	Own *pgdriver.Statements
}

// Host is the caller's connection as its session-lock tracking ([Conn])
// uses it: what needs the caller's driver connection, its hooks or its
// database. The caller's connection (a pointer) implements it and gives
// itself to [Conn.Init].
//
// Locks: any method may be called with the Conn's Exec mutex held (the
// statements lockhooks runs on a parked connection), so none may take it.
// String and PoolerDetected may also be called with State's mutex held,
// as may ReleaseTurn and HoldEnded (said below), so those four take
// neither mutex nor call back into the Conn; the others are called
// without State's mutex and may take it (the root's InTx does).
type Host[K NamedKey] interface {
	fmt.Stringer
	// Unwrap returns the driver's connection, for a statement of
	// lockhooks' own that bypasses the caller's hooks and bookkeeping
	// (the read of pg_locks).
	Unwrap() driver.Conn
	// ExecOwn runs a statement of lockhooks' own on the connection,
	// bypassing the hooks, its round trip noted (RoundTrips).
	ExecOwn(ctx context.Context, query string) error
	// BackendPID returns the connection's backend pid, asking the server
	// the first time.
	BackendPID(ctx context.Context) (int32, error)
	// InTx reports whether the connection is inside a transaction block.
	InTx() bool
	// Observe notes an error of the driver's connection (one that did
	// not come from the server may mean a broken connection) and returns
	// the error to report: err, or what the caller makes of it (the root
	// turns a deadlock victim's into its *DeadlockError).
	Observe(err error) error
	// SessionMarker is the session marker the connection left on its backend
	// ("" when it left none).
	SessionMarker() string
	// PoolerDetected is the error for a connection found sharing a
	// backend (what says how), as Member's.
	PoolerDetected(what string) error
	// SawPooler records, in the database, the proof (err) of a
	// transaction-mode pooler nobody declared.
	SawPooler(err error)
	// ConnectionBroken reports whether err means that the connection is gone.
	ConnectionBroken(err error) bool
	// LoseLocks reports the connection's locks lost, because its
	// connection died of cause.
	LoseLocks(cause error) error
	// Settle tells the database's registry what the connection holds now.
	Settle()
	// ReleaseTurn gives key's turn, which the connection owned, back to
	// its database's queue; State is locked (the queue's mutex is a leaf).
	ReleaseTurn(key int64)
	// HoldEnded records that a session lock held since since was freed;
	// State is locked (telemetry only).
	HoldEnded(since time.Time)
	// QueryValue runs a statement of lockhooks' own on the connection,
	// bypassing the hooks, its round trip noted, and returns the first
	// column of its first row.
	QueryValue(ctx context.Context, query string, args ...driver.NamedValue) (driver.Value, error)
	// QueryRow runs a statement of lockhooks' own on the connection,
	// bypassing the hooks, its round trip noted, and returns its first
	// row.
	QueryRow(ctx context.Context, query string, args []driver.NamedValue) ([]driver.Value, error)
	// UnlockRerouted counts an unlock rerouted to the connection.
	UnlockRerouted(ctx context.Context)
	// ThroughPooler reports whether a pooler stands between the
	// connection and the server: declared (either kind), or seen.
	ThroughPooler() bool
	// Ends is the database's queue of backends to end.
	Ends() *EndQueue
	// ReportLoss logs, counts and traces a loss (MarkLostOn, LossReport).
	ReportLoss(l Loss)
	// LockLost tells what waits in this process on the connection's
	// locks that they are lost (an AdvisoryLock's turn is freed, so that
	// another acquirer may take the key at once); before Lost's channel
	// closes.
	LockLost()
	// LoseIfReleased reports lost an AdvisoryLock held on the connection
	// whose key a statement of its own (text; "": of the transaction that
	// just ended) released behind it.
	LoseIfReleased(text string)
	// TxBegun reports whether the connection runs a transaction its
	// caller began (BeginTx), which ends by its Commit or Rollback, not
	// by statement text.
	TxBegun() bool
}

// Init gives the connection its database's settings and its host, before
// any other goroutine can see it.
func (c *Conn[K]) Init(set *Settings, host Host[K]) { c.set, c.host = set, host }

// UpdateLocked recomputes whether statements need the slow path, and
// gives up the turns the connection no longer needs; State is locked.
func (c *Conn[K]) UpdateLocked() {
	if c.UpdateActiveLocked() {
		c.ReleaseTurnsLocked(c.host.ReleaseTurn)
	}
}

package lockhooks

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/pgstmt"
)

// ErrLockLost is wrapped by the errors that report a lock whose connection
// died (terminated backend, broken network, a cancelled statement that made
// the driver close the connection) or was closed by db.Close, and by those
// that report an AdvisoryLock released by a statement on its own
// connection. The work the lock protected must stop: other processes may
// hold the lock now.
var ErrLockLost = pgsession.ErrLockLost

// ErrNotLockOwner is wrapped by the error returned, instead of Postgres's
// silent false, for a pg_advisory_unlock that cannot be honoured: no
// connection of this database holds the key, or the one that does is in
// use elsewhere.
var ErrNotLockOwner = pgsession.ErrNotLockOwner

// LockID returns the advisory-lock key for name: the last 8 bytes of its
// SHA-256, big-endian, with the top bit cleared, the same as dstack's
// string_to_lock_id.
//
// LockID also remembers name, so that lockhooks shows the key by its name
// wherever it shows it (/debug/locks and its JSON, the slow-wait log,
// errors, span attributes): "nightly-report (4290127349813372591)". This
// memory is the package's one process-wide state: bounded (the last few
// thousand names), it costs a read-locked map lookup when the name is
// already known and one insertion when it is not.
func LockID(name string) int64 {
	k := lockID(name)
	keyNames.Remember(k, name)
	return k
}

// lockID is LockID without remembering the name.
func lockID(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[24:]) & (1<<63 - 1))
}

// InTx reports whether the connection is inside a transaction block, opened
// by database/sql or by statement text.
func (c *conn) InTx() bool {
	if c.tx.inner != nil {
		return true
	}
	c.pin.Lock()
	defer c.pin.Unlock()
	return c.pin.TextTx
}

// advisoryPlan is what the hooks do around one statement on the slow
// path: one that calls advisory-lock functions, takes row locks, or runs
// on a connection holding locks (pgstmt.Plan, made by
// pgstmt.Database.Before and applied by its After).
type advisoryPlan = pgstmt.Plan[*conn, lockKey]

// statements is what the statements of one database on the slow path
// share (pgstmt.Database), filled in newConnector.
type statements = pgstmt.Database[*conn, lockKey]

// planned is what the statement's plan reads of it.
func (st statement) planned() pgstmt.Statement {
	return pgstmt.Statement{Text: st.text, Advisory: st.advisory, Locks: st.locks, RowLock: st.rowLock, Rewrote: st.rewrote}
}

// Direct reports whether c reaches the server itself (pgstmt.Conn).
func (c *conn) Direct() bool { return c.direct }

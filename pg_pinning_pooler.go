package lockhooks

import (
	"errors"
)

// WithSessionPinningPooler says the DSN goes through a pooler that pins a
// client's session to one server connection once the client takes a
// session advisory lock, until the client disconnects: RDS Proxy (which
// pins on pg_advisory_lock, never on the transaction-level locks), or
// PgBouncer in session mode (which pins every client). Session locks then
// stay with the connection that took them, as on a direct connection, and
// two things change:
//
//   - Until a connection holds a session lock the pooler may run its
//     statements on any server connection, so the backend lockhooks met at
//     connect is not taken for the connection's: a session lock is looked
//     for on the backend that answers right after it, and that backend is
//     the connection's from then on. Without the option, a connection found
//     on another backend than its own is reported as a transaction-mode
//     pooler (ErrTransactionPooler): a false alarm through RDS Proxy. Once a
//     session lock is held, the connection must stay on its backend; if it
//     does not, the pooler does not pin and that is reported as before.
//   - A connection that has held a session lock is closed, instead of
//     going back to the pool, once it holds none: the pooler keeps it
//     pinned until it disconnects, and a pinned connection in the pool
//     would keep a server connection for itself for ever. RDS Proxy then
//     unpins the server connection; PgBouncer in session mode resets it
//     (DISCARD ALL) and gives it to the next client.
//
// The cost: a new client connection after each connection that held a
// session lock is released (AcquireAdvisoryLock's included). It cannot be
// combined with [WithTransactionPooler], which is for poolers that do not
// pin.
func WithSessionPinningPooler() Option {
	return func(o *options) { o.pinningPooler = true }
}

// errPoolerOptions refuses both pooler options at once.
var errPoolerOptions = errors.New("lockhooks: WithTransactionPooler and WithSessionPinningPooler describe different poolers; choose the one the DSN goes through (PgBouncer in transaction mode: WithTransactionPooler; RDS Proxy, PgBouncer in session mode: WithSessionPinningPooler)")

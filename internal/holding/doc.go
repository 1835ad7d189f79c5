// Package holding is what this process's connections hold, as the model
// of holders names them: a connection's session advisory locks and its
// open transaction as the holder of what a waiter waits for ([Of]), the
// connections among a database's that hold a key ([Among]), the lock
// modes a request conflicts with ([Conflicting]), an open transaction's
// identity as other goroutines see it ([Tx]: when and where it began, its
// span, its context and its goroutine), and, on the way to a wait, the
// transaction of the waiter's own call chain open on another connection
// ([SelfWait]: certain when RunInTx's fn runs on the waiting goroutine,
// else likely).
//
// The connections are the adapter's ([Conn], generic so that a connection
// is its own type here, and a database's set of them its own map, ranged
// over without allocating); their session
// locks are the session-lock machine's, read through [Locks] under the
// connection's own mutex. A holder is a [holders.Holder], formatted by
// internal/holders alone.
//
// State: none but each connection's [Tx], guarded by its own mutex (its
// goroutine an atomic).
//
// Imports: internal/holders (the holder value), internal/advisorykey (the
// key and its modes), internal/callsite (call sites, goroutines, call
// chains) and OpenTelemetry's trace package (a holder's span); never a
// driver, the SQL scanner, the session-lock machine or the root.
package holding

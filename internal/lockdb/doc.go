// Package lockdb is one lockhooks database as the core sees it, whatever
// adapter wraps its connections: its open connections, its in-process
// lock tables (SQLite's advisory locks and locksets, the turns of
// Postgres advisory keys) and its writer lock, its waits in progress and
// events, its Postgres session-lock registry and its reader of who blocks
// whom; and what the database answers from them: who holds what a wait
// waits for ([DB.HoldersOf]: in process from the lock tables and the
// connections' session locks, on Postgres from the server), who waits for
// whom in process ([DB.Edges]), whose turn a waiter waits behind
// ([DB.TurnAhead]), the queue of turns for the pool-deadlock guard
// ([DB.TurnQueue]), the other connection whose transaction belongs to the
// waiter's own call chain ([DB.SelfWait]), and what the debug page shows of it
// ([DB.State], [DB.HeldPage]).
//
// The connections are the adapter's, generic as a [Conn] (the root's
// *conn); a lock table's owner is the adapter's value too, whose
// connection [DB.OwnerConn] finds. Holders are named by internal/holding
// and internal/inprocess, formatted by internal/holders alone; the page is
// internal/debugpage's, handed a snapshot.
//
// State: the set of open connections (its own mutex) and the fields of
// [DB], which the adapter fills when it opens the database; the lock
// tables, the waits and the registry keep their own.
//
// Imports: internal/holders, internal/holding, internal/inprocess,
// internal/waits (the model of holders and waiters), internal/pgsession
// and internal/pgblocking (a connection's session locks and who blocks
// whom on the server), internal/debugpage (the snapshot it fills),
// internal/keynames, internal/lockset, internal/advisorykey,
// internal/sqlitelock and internal/callsite; never database/sql, its
// driver package, the SQL scanner or the root itself (pgsession and
// pgblocking do, below it: lockdb joins the model to them).
package lockdb

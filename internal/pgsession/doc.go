// Package pgsession is Postgres session-lock tracking: what lockhooks does
// to keep a session advisory lock with the physical connection that took
// it, and to report, never continue past, one that is lost.
//
// Its job, once whole, is the per-connection state machine (track, park,
// reroute, reconcile, loss, the monitor, poolers) over a small interface
// for running its own statements; ARCHITECTURE.md says which parts are
// here and which are still the root package's. Here today: recovery, the
// one action lockhooks takes on the server by itself, ending the backend
// of a holder it gave up on so that the key is truly free ([EndQueue],
// [EndBackend]).
//
// The rule for ending a backend: lockhooks ends one only where it can
// prove that no other client can have used it since lockhooks last did.
//   - The connection reached the server itself (the process id the server
//     sent at connect is the backend's own pid) and no pooler is declared
//     or was seen: the caller's decision, before it asks ([EndQueue.Add]).
//     Through any pooler, session or transaction mode, a backend serves
//     other clients once lockhooks' client connection is gone.
//   - It is the same incarnation of the pid (its backend_start and its
//     server's start time, [IncarnationExpr]): never a reused pid, never
//     another server's.
//   - It has started no statement since lockhooks' last one could have
//     reached it ([EndTarget.Quiet], measured from when that statement was
//     sent plus [EndSlack], never from when its answer came back).
//   - It still holds or awaits one of the lost keys.
//
// All of it is checked by the server in the one statement that ends the
// backend ([EndBackend]), so nothing changes between the check and the
// act.
//
// State: the queue of end requests of one database ([EndQueue]); its
// mutex is a leaf (taken under any other lock, none taken under it).
//
// Imports: internal/advisorykey; database/sql/driver for the values of
// its own statements.
package pgsession

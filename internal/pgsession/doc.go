// Package pgsession is Postgres session-lock tracking: what lockhooks does
// to keep a session advisory lock with the physical connection that took
// it, and to report, never continue past, one that is lost.
//
// Its job, once whole, is the per-connection state machine (track, park,
// reroute, reconcile, loss, the monitor, poolers) over the caller's
// connection as a [Host], which runs lockhooks' own statements there and
// reports to its database; ARCHITECTURE.md says which parts are here and
// which are still the root package's (the plan made before a statement
// runs, the in-process turns, the lock waits). Here today:
//   - what one connection keeps for session-lock tracking ([Conn]: the
//     state below, the backend it reached at connect, its round trips and
//     its pooler holder, with what needs them together: the backend its
//     locks live on, an end request's target);
//   - the state a connection keeps of its advisory locks ([State]): the
//     session locks it holds ([Held]), its transaction-level ones, whether
//     it is parked, lost or unverified, the turns it owns in its
//     database's in-process queue, and the transitions that need no
//     connection (a grant, a release, pg_advisory_unlock_all, DISCARD
//     ALL, the end of a transaction, whether statements take the slow
//     path, and the effect of a statement's advisory calls as the scanner
//     found them, [State.ApplyLocked]); the statement's classification
//     and what needs the server stay the caller's, which passes in their
//     outcome as values;
//   - the connection's identity as other processes see it ([Identity]:
//     its process, database and number, and whether it publishes an
//     application_name), and the texts that carry it on statements that
//     run anyway ([Conn.TxAppName], [Conn.LockText], [Conn.Note],
//     [Conn.OwnLocksQuery], [Conn.SavepointRelease]); which statements
//     carry them stays the caller's; and the read at connect, in the one
//     statement a connection runs then anyway, of its backend pid, the
//     application_name the user gave it, its backend's incarnation and
//     the session marker it leaves there ([Conn.Identify], [Opened]),
//     or, where that read cannot run, the same later through the
//     caller's own statements ([Conn.ReadPID], over [Host].QueryRow);
//   - what the tracking checks before a statement runs (a lone
//     transaction-level lock outside a transaction refused, the server
//     asked whether a block is open, [Conn.RefuseUselessXact]; counts
//     that may be off, [Conn.AnyApprox]);
//   - what a statement's answer does to the tracking ([Conn.After], over
//     the [Plan] the caller made before it ran: the keys it granted or
//     released, DISCARD ALL, the read of pg_locks where the text cannot
//     tell, the breaks that lose the locks) and the transaction blocks
//     statement text opens and closes ([Conn.FollowTxControl],
//     [Conn.TransactionEnded]);
//   - reading the truth: pg_locks of the connection's backend, read on
//     the connection itself (in a savepoint inside a transaction; on its
//     holder through a transaction pooler) and the tracking made equal to
//     it ([Conn.Reconcile], [Conn.ReadLocks]), with the checks that the
//     backend that answered is the connection's (a pooler nobody
//     declared; [Conn.FollowPin] through a session-pinning one), a
//     connection whose holdings are unknown read again
//     ([Conn.VerifyUnknown]), one returned to the pool read
//     ([Conn.VerifyOnReturn]), and a parked one asked by the monitor
//     ([Conn.Answers], [Conn.VerifyParked]); all over the caller's
//     connection as a [Host], which runs lockhooks' own statements there
//     and reports to its database, and the database's [Settings];
//   - a loss ([Conn.MarkLostOn]: the locks taken from the tracking, the
//     error statements get from then on, wrapping [ErrLockLost], whether
//     its backend is ended, [Conn.EndOnLoss]), its transitions
//     ([TakeHeldLocked], [State.SetLostLocked]) and the error a statement
//     gets with it ([LostError]); how it is reported is the host's
//     ([Loss]);
//   - statements through poolers: which advisory calls run on the holder
//     of a declared transaction pooler ([Conn.OnHolder],
//     [Conn.RunOnHolder]), what cannot be split there
//     ([Conn.SplitConflict]), a statement refused once a pooler nobody
//     declared was seen ([Conn.RefuseThroughPooler], [PoolerError]);
//   - releases: every session lock at once ([Conn.Clear]: DISCARD ALL),
//     and an unlock sent on another connection of the database, rerouted
//     to the parked connection that holds the key ([Conn.UnlockParked],
//     which forgets the key with [Conn.Forget]; refused with
//     [ErrNotLockOwner] where it cannot be honoured);
//   - recovery, the one action lockhooks takes on the server by itself,
//     ending the backend of a holder it gave up on so that the key is
//     truly free ([EndQueue], [EndBackend]), and the round trips of a
//     connection that tell when its backend last ran a statement of
//     lockhooks' ([RoundTrips]: the quiet time an end request carries);
//   - the holder that keeps a connection's session locks through a
//     transaction-mode pooler, a server connection of its own inside a
//     transaction ([Holder]: opened, begun, pinged, ended), and what runs
//     there ([TxHolder], over the connection as a [HolderHost]: a lock
//     statement in a savepoint, a blocking lock polled, the ping before
//     the protected work, the end of its transaction once nothing is
//     held, and its loss when it fails);
//   - the registry of one database's connections that hold session locks,
//     in use or parked ([Registry], over the caller's connection as a
//     [Member]): registering and settling them, closing a parked one once
//     it holds nothing, db.Close, the proof of an undeclared transaction
//     pooler; and its monitor, one goroutine per database while there is
//     something to watch, which checks on a side connection that the
//     holders' backends are alive and hold their locks, loses what cannot
//     be confirmed when the server cannot be reached, warns of long
//     parked holds, and ends the backends of lost holders;
//   - the pool-deadlock guard ([PoolGuard]): a lock statement of one
//     bigint key that waits in memory for the key's turn (the database's
//     in-process queue, the caller's, copied as [Turn]s) gives up with
//     [ErrPoolDeadlock] once every connection of the pool waits for a
//     key whose holder needs the pool to be released (a parked holder,
//     or an AdvisoryLock that waits for a connection), and with
//     [ErrClosedWhileQueued] at db.Close.
//
// The rule for ending a backend: lockhooks ends one only where it can
// prove that no other client can have used it since lockhooks last did.
//   - The connection reached the server itself (the process id the server
//     sent at connect is the backend's own pid) and no pooler is declared
//     or was seen ([Conn.Endable], checked before any end is asked for:
//     [Conn.EndOnLoss], or the caller before [EndQueue.Add]).
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
// State: one connection's session-lock tracking ([Conn]: its Exec mutex
// is taken after the registry's and before its State's); its advisory
// locks ([State]; its mutex is taken
// after the registry's and the caller's statement locks, and only leaves
// are taken under it: the turn table's and the telemetry of a freed hold);
// one database's holders ([Registry]: its mutex first, before any
// member's; the monitor's goroutine, stopped by Close);
// the queue of end requests of one database ([EndQueue]; its mutex is a
// leaf: taken under any other lock, none taken under it); one connection's
// last round trips ([RoundTrips]: atomics, and a leaf mutex); one
// connection's pooler holder ([Holder], [TxHolder]: used by one goroutine
// at a time, its backend pid in an atomic); when a pool deadlock was last
// logged ([PoolGuard]: atomics; it copies the registry's holders under
// the registry's mutex, lets it go, then takes each member's State mutex
// in turn, never two at once).
//
// Imports: internal/advisorykey (the keys), internal/callsite (where a
// transaction took its first transaction-level lock), internal/rawconn
// and internal/pgdriver (the holder's own statements, and what the driver
// allows them), internal/pgserver (the monitor's read of the holders'
// backends), internal/dberr (whether an error is the server's),
// internal/sqlscan (the flags of a statement's advisory calls),
// internal/identity (the encoding of a holder's identity);
// database/sql/driver for the values of its own statements and of the
// caller's (a statement's answers, ApplyLocked);
// OpenTelemetry's trace package for the span a lock was taken in.
package pgsession

// Package pgstmt is one statement on lockhooks' slow path, from its plan
// to its accounting, whatever adapter runs it: a statement that calls
// advisory-lock functions, takes Postgres row locks, or runs on a
// connection holding session locks. Before it runs ([Database.Before]):
// the session-lock tracking's refusals and its plan (keys resolved, from
// the text, the arguments or the server), a rerouted unlock answered
// without the statement, the key's turn in the in-process queue (a
// try-lock answered false in memory), the holder's annotation on the text
// it is sent with, the unlocks a larger statement cannot send elsewhere,
// the self-wait it would be, and its lock wait started with the holders
// this process knows. After it ([Database.After]): the tracking brought up
// to date, the turn settled, the self-wait probe ended, the holder of a
// wait that gave up named ([Database.NameHolder]) and the wait ended with
// its outcome.
//
// The adapter runs the statement itself (with [Plan.Sent] where set) and
// gives its connection as a [Conn]: a connection of the database as the
// core sees it (internal/lockdb), the host of its session-lock tracking
// (internal/pgsession), and what only the adapter knows (whether it
// reaches the server itself, the call site, a key evaluated by the
// server, its transaction).
//
// State: none of its own; a [Plan] lives for one statement, a [Database]
// is filled by the adapter when it opens the database.
//
// Imports: internal/lockdb (the database as the core sees it),
// internal/pgsession (the session-lock machine), internal/stmtlocks and
// internal/sqlscan (what a statement takes), internal/waits,
// internal/telemetry, internal/holders, internal/holding,
// internal/inprocess, internal/pgblocking, internal/rawconn,
// internal/advisorykey and internal/dberr; never database/sql (its
// driver package for values only) or the root.
package pgstmt

// Package identity encodes and decodes who a Postgres backend is, as
// lockhooks publishes it for other processes: a holder's identity in
// application_name and in the comment that begins lockhooks' own
// statements.
//
// While a connection holds session advisory locks or is inside a
// transaction, another process running lockhooks can read who it is from
// what Postgres shows every session in pg_stat_activity, without any schema
// object.
//
// application_name (at most 63 bytes) is set by lockhooks only on
// connections whose application_name is empty (the user's configuration is
// law: a DSN, PGAPPNAME or SET that names the application turns it off), in
// a compact form ([Holder.AppName]):
//
//	lockhooks <host>/<pid>#<database>.<connection> tx <site>
//	lockhooks <host>/<pid>#<database>.<connection> lock <site> @<since>
//
// "tx" is a transaction begun at site (its age is pg_stat_activity's
// xact_start); "lock" a session advisory lock taken at site, since <since>
// (Unix milliseconds in base 36), then " %<pool>" when the database has a
// pool name. A long site keeps its end; what does not fit is left out (the
// trace never fits: only the annotation has it).
//
// lockhooks' own statements on a holder (the pg_locks read after a lock
// statement, a transaction-pooler holder's statements) begin with a comment
// that names the holder in full ([Holder.Annotation]):
//
//	/*lockhooks holder: process=<host>/<pid> db=<n> conn=<n> holds=<…>
//	site=<file:line> since=<RFC 3339> trace=<trace id>-<span id>*/
//
// so the last statement another process sees for a parked connection says
// whose it is instead of looking like application code.
//
// [SetAppName] is the expression that sets application_name without
// overriding the user's. [Decode] reads both back. Where the identities are written (only into
// statements that run anyway) and how waiters use what they decode is the
// root package's business (pg_identity_publish.go, pg_blockers.go).
//
// State: none, except this process's label ([ProcessLabel]), drawn once.
//
// Imports: nothing of lockhooks' own; OpenTelemetry's trace package for a
// holder's span.
package identity

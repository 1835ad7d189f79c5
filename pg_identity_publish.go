package lockhooks

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Publishing a holder's identity (encoded by internal/identity; the texts
// that carry it are composed by pgsession.Conn, its identity.go), always inside
// statements that run anyway, so that no statement path gains a round trip:
//
//   - Connect's read of the backend pid also reads the application_name the
//     user's configuration gave the connection; lockhooks sets its own only
//     where that is empty.
//   - A transaction's identity rides on its BEGIN, which lockhooks sends
//     itself (pg_begin.go): "BEGIN …; SELECT set_config('application_name',
//     …, true)" in one simple-protocol message. The setting is
//     transaction-local, so nothing outlives the transaction on the server
//     connection: through PgBouncer's transaction mode no other client ever
//     sees it (PgBouncer 1.18 does not reset application_name for clients
//     that set none, so a session-level SET would leak there; 1.25 does).
//     The site is where the transaction began, from the stack tx.begin
//     records anyway, named through the database's callsite.Names.
//   - A session advisory lock's identity rides on the statement that
//     leaves it held: on a connection to the server itself, the exact
//     session-lock or unlock statement of one call (pgsession.Conn.LockText);
//     elsewhere the pg_locks read that follows it (pgsession.Conn.ReadLocks); and
//     the fencing-token read. They carry the annotation, so the holder's
//     last statement names it while it runs no other (a parked holder, a
//     leaked lock). Nothing is set at session level: a
//     session lock taken through a transaction pooler nobody declared (the
//     pool idle, so the undeclared-pooler guard has not seen it yet) would
//     leave the setting on a server connection that later serves other
//     clients (PgBouncer 1.18 keeps it for clients that set none), where
//     nothing could reset it. Through a declared transaction pooler the
//     holder connection's statements carry the annotation and a
//     transaction-local application_name.
//
// Identities change with every hold, so the statements that carry them must
// not be cached by the driver by their text: pgx (v5) caches every query by
// text by default, so lockhooks runs its own queries there in pgx's simple
// protocol (one round trip, no prepared statement); lib/pq runs queries
// without arguments that way already (pgdriver.Statements, pg_begin.go). On other
// drivers lockhooks publishes nothing (it still reads the identities
// others publish).

// identifyOnConnect reads, in the one statement Connect runs on Postgres
// anyway, the backend pid and the application_name the user's
// configuration gave the connection, and, unless the database declared a
// pooler, leaves the connection's session marker on its backend
// (pgsession.Conn.Identify). Through a driver that cannot run such a text
// uncached, the pid alone is read (BackendPID).
func (w *conn) identifyOnConnect(ctx context.Context) error {
	own := w.connector.own.Of(w.inner)
	if !own.OK() {
		_, err := w.BackendPID(ctx)
		return err
	}
	got, err := w.pin.Identify(ctx, own, w.markerToLeave())
	if err != nil {
		return err
	}
	if own.PGX {
		w.tx.status = pgdriver.TxStatus(w.inner)
		// The annotated statements of a direct connection may go in pgx's
		// exec mode (sentWith): not where the user asked for the simple
		// protocol.
		w.direct = w.pin.ReachesServer && !w.connector.opts.txPooler && !w.connector.opts.pinningPooler &&
			pgdriver.DefaultMode(w.inner) != own.Args[0].Value
	}
	if got.Server != "" && w.connector.server.Load() == nil {
		// The server's start time names the server (backend pids are per
		// server).
		w.connector.server.Store(&got.Server)
	}
	w.settleMarker(got)
	return nil
}

// holderNote is the annotation that names c as the holder of its session
// locks on a statement of lockhooks' own run on c's backend, and the
// arguments that keep the statement out of the driver's statement cache
// (pgsession.Conn.NoteOwn); "" and nil when there is none.
func (c *conn) holderNote() (string, []driver.NamedValue) {
	if note := c.pin.NoteOwn(nil); note != "" {
		return note, c.connector.own.Args
	}
	return "", nil
}

// ReleaseLockSavepoint ends the savepoint of a statement run on c's
// transaction-pooler holder (pgsession.TxHolder.Run). On a connection that
// publishes identities it also sets the holder's application_name for its
// transaction and begins with the annotation, so that the holder's last
// statement names it (pgsession.Conn.SavepointRelease).
func (c *conn) ReleaseLockSavepoint(ctx context.Context, h driver.Conn) error {
	if !c.connector.own.OK() {
		return rawconn.Exec(ctx, h, "RELEASE SAVEPOINT lockhooks_lock")
	}
	return rawconn.ExecSimple(ctx, h, c.pin.SavepointRelease(ctx, siteOf))
}

package pgsession

import (
	"context"
	"database/sql/driver"
	"fmt"
	"sync/atomic"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// Holder keeps a connection's session locks through a transaction-mode
// pooler: a server connection of its own, inside a transaction while it
// holds anything (the pooler keeps a transaction's server connection
// linked to its client, so the locks stay where they were taken). The
// connection's goroutine uses it, or whoever runs the connection's own
// statements for it (one at a time); PID is read by other goroutines.
// Its zero value has no connection.
type Holder struct {
	conn driver.Conn // nil: none open
	inTx bool
	pid  atomic.Int32 // the backend while inTx, 0 otherwise
}

// Conn is the holder's connection, or nil when none is open.
func (h *Holder) Conn() driver.Conn { return h.conn }

// Open makes conn the holder's connection; it has none.
func (h *Holder) Open(conn driver.Conn) { h.conn = conn }

// InTx reports whether the holder's connection is open and inside its
// transaction.
func (h *Holder) InTx() bool { return h.conn != nil && h.inTx }

// PID is the holder's backend while its transaction is open, or 0.
func (h *Holder) PID() int32 { return h.pid.Load() }

// Begin begins the holder's transaction and reads its backend pid. Where
// the driver runs a text of several statements in one simple-protocol
// message (own), both go in one round trip, "SELECT pg_backend_pid();
// BEGIN": the query runs in the implicit transaction that BEGIN turns into
// the block, so on the block's backend (one Query message is one
// transaction to a pooler, which then keeps the server connection linked
// while the block is open, as it would after a BEGIN of its own); pgx
// returns the first statement's row, lib/pq the first that has one. (The
// read names the backend's incarnation too, IncarnationExpr, which a
// holder does not keep: through a pooler lockhooks never ends a backend.)
// The caller drops a holder whose Begin failed.
func (h *Holder) Begin(ctx context.Context, own *pgdriver.Statements) error {
	const read = "SELECT pg_backend_pid(), " + IncarnationExpr
	query, args := read+"; BEGIN", own.Args
	if !own.OK() {
		if err := rawconn.Exec(ctx, h.conn, "BEGIN"); err != nil {
			return err
		}
		query, args = read, nil
	}
	rows, err := rawconn.Query(ctx, h.conn, query, args)
	var row *rawconn.Row
	if err == nil {
		row, err = rawconn.ReadRow(rows)
	}
	if err == nil && len(row.Values()) != 2 {
		err = fmt.Errorf("lockhooks: reading the holder's backend pid: %d columns, want 2", len(row.Values()))
	}
	if err != nil {
		return err
	}
	h.inTx = true
	h.pid.Store(int32(pgdriver.AsInt64(row.Values()[0])))
	return nil
}

// Drop closes the holder's connection after a failure outside the
// server's control (its transaction, and the locks it kept, are gone) and
// returns the backend it had (0: none).
func (h *Holder) Drop() (pid int32) {
	pid = h.pid.Load()
	h.Close()
	return pid
}

// Ping asks the holder's connection whether it still answers: the
// driver's Ping, or a SELECT 1.
func (h *Holder) Ping(ctx context.Context) error {
	if p, ok := h.conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return rawconn.Exec(ctx, h.conn, "SELECT 1")
}

// EndTx ends the holder's transaction, if one is open, within ctx.
// Session locks survive COMMIT, so it unlocks everything first; if that
// fails, the connection is closed (the pooler drops a server connection
// whose client left mid-transaction, and its locks with it).
func (h *Holder) EndTx(ctx context.Context) {
	if !h.InTx() {
		return
	}
	err := rawconn.Exec(ctx, h.conn, "SELECT pg_advisory_unlock_all()")
	if err == nil {
		err = rawconn.Exec(ctx, h.conn, "COMMIT")
	}
	if err != nil {
		h.Close()
	} else {
		h.inTx = false
	}
	h.pid.Store(0)
}

// Close closes the holder's connection, if one is open (after EndTx, or
// instead of it); a connection opened later begins a transaction anew.
func (h *Holder) Close() {
	if h.conn != nil {
		h.conn.Close()
	}
	h.conn, h.inTx = nil, false
	h.pid.Store(0)
}

package lockhooks

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/pgblocking"
	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// The Postgres side of the model of holders (holders*.go): who blocks whom
// as the server shows it, for the slow-wait log, the wait spans, the
// errors of waits that time out, deadlocks and the debug page, read on the
// database's side connection and matched to its connections in
// internal/pgblocking, which also names each backend as the model's
// holder (pgblocking.Identify: by the identity it published, or as a
// connection of this process, found by holders_blockage.go's identify). Here: the
// database's side connection and its reader, and the connection as the
// reader matches backends to it.

// sideConnsPerDatabase is how many server connections outside its pool a
// Postgres database of lockhooks opens at most, each lazily and each closed
// by db.Close: one for the lookups (rawconn.Side: the debug page, the
// slow-wait log, the wait spans, the errors of waits that time out,
// deadlock errors, the self-wait probe) and one for the monitor of session
// locks (pg_monitor.go), open only while a connection holds session locks.
// A database through a transaction pooler also keeps, per pooled
// connection that holds session locks, the holder connection those locks
// live on (pg_pooler.go): that one is part of the connection, not a side
// connection. The debug page and the lookups never open a server
// connection of their own.
const sideConnsPerDatabase = 2

// openSide gives c its side connection (nothing is opened yet) and the
// reader of who blocks whom on it, before c joins the process's registry
// (which sets c's number: the reader reads it when it needs it, as it
// does c's session-lock tracking).
func (c *connector) openSide() {
	c.side = rawconn.NewSide(func(ctx context.Context) (driver.Conn, error) { return c.inner.Connect(ctx) })
	c.Blocking = pgblocking.New(pgblocking.Config[*conn]{
		Side:       c.side,
		Own:        &c.own,
		Database:   func() uint64 { return c.seq },
		TxPooler:   c.opts.txPooler,
		PoolerSeen: func() bool { return c.pins != nil && c.pins.PoolerSeen() != nil },
		Conns:      c.Conns,
		SeenBy:     c,
		Timeout:    blockerLookupTimeout,
	})
}

// HolderPID is the backend of the holder connection c keeps through a
// transaction pooler, 0 when none (pgblocking.Conn).
func (c *conn) HolderPID() int32 { return c.pin.Hold.PID() }

// ConnectApp is c's application_name at connect (pgblocking.Conn).
func (c *conn) ConnectApp() string { return c.pin.Who.ConnectApp }

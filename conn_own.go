package lockhooks

// lockhooks' own statements on a connection: BEGIN IMMEDIATE for SQLite
// writers, statements lockhooks runs for itself (its own BEGIN, ROLLBACK,
// the backend's pid, pg_locks reads) and the helpers that read their single
// row, plus the adapters for legacy drivers without the context methods.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// beginsImmediate reports whether a transaction with opts is an SQLite
// write transaction that lockhooks begins itself. On a read-only open
// nothing can write, and BEGIN IMMEDIATE would fail under query_only, so
// every transaction there begins as the driver begins it.
func (c *conn) beginsImmediate(opts driver.TxOptions) bool {
	return c.connector.opts.dialect == SQLite && !opts.ReadOnly && c.connector.sqlite.ReadOnly == ""
}

// beginImmediate begins an SQLite write transaction under the writer lock:
// BEGIN IMMEDIATE, or BEGIN EXCLUSIVE when the DSN says _txlock=exclusive
// (a deferred BEGIN would let a read-then-write transaction meet
// SQLITE_BUSY; taking the write lock at BEGIN is lockhooks' purpose).
// Where the driver begins that way itself (modernc, see
// sqlitelock.DSN.PlanModerncBegin), its BeginTx runs the BEGIN; otherwise lockhooks does.
func (c *conn) beginImmediate(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := c.connector.writer.lock(ctx, c.connector.tel, c, c.connector.opts.busyTimeout, ""); err != nil {
		return nil, err
	}
	begun := false
	defer func() {
		if !begun { // BEGIN failed, or the driver panicked
			c.connector.writer.unlock()
		}
	}()
	var inner driver.Tx = immediateTx{c}
	if c.driverBegins {
		var err error
		if inner, err = c.beginner.BeginTx(ctx, opts); err != nil {
			return nil, c.Observe(err)
		}
	} else {
		begin := "BEGIN IMMEDIATE"
		if c.connector.sqlite.TxLock == "exclusive" {
			begin = "BEGIN EXCLUSIVE"
		}
		if err := c.ExecOwn(ctx, begin); err != nil {
			return nil, c.Observe(err)
		}
	}
	begun = true
	t := c.tx.begin(ctx, inner, opts, nil)
	t.writer = true
	t.took(&t.writerSince)
	return t, nil
}

// ExecOwn runs a statement of lockhooks' own (BEGIN, COMMIT, ROLLBACK) on
// the inner connection, bypassing the hooks, through its Execer or, for
// drivers without one, through Prepare.
func (c *conn) ExecOwn(ctx context.Context, query string) error {
	run := func() error {
		if c.execer != nil {
			_, err := c.execer.ExecContext(ctx, query, nil)
			return err
		}
		return c.execPrepared(ctx, query)
	}
	if c.connector.pins == nil {
		return run()
	}
	return c.noteRoundTrip(query, run) // Postgres: the backend's last statement (pg_loss.go)
}

// execPrepared runs a statement of lockhooks' own through Prepare, for
// drivers without an Execer.
func (c *conn) execPrepared(ctx context.Context, query string) error {
	s, err := c.inner.Prepare(query)
	if err != nil {
		return err
	}
	defer s.Close()
	if e, ok := s.(driver.StmtExecContext); ok {
		_, err = e.ExecContext(ctx, nil)
	} else {
		_, err = s.Exec(nil) //nolint:staticcheck // no ExecContext
	}
	return err
}

// BackendPID returns the Postgres backend pid of the connection, asking the
// server once, the first time a feature needs it (pgsession.Conn.ReadPID).
// Unless a pooler is declared, the same statement leaves the connection's
// marker on its backend.
func (c *conn) BackendPID(ctx context.Context) (int32, error) {
	if pid := c.pin.PID.Load(); pid != 0 {
		return pid, nil
	}
	if c.connector.pins == nil {
		return 0, errors.New("lockhooks: a backend pid is a Postgres notion")
	}
	got, err := c.pin.ReadPID(ctx, c.markerToLeave())
	if err != nil {
		return 0, err
	}
	c.settleMarker(got)
	return c.pin.PID.Load(), nil
}

// QueryValue runs a statement of lockhooks' own on the inner connection,
// bypassing the hooks, and returns the first column of its first row.
func (c *conn) QueryValue(ctx context.Context, query string, args ...driver.NamedValue) (driver.Value, error) {
	row, err := c.QueryRow(ctx, query, args)
	if err != nil {
		return nil, err
	}
	return row[0], nil
}

// QueryRow runs a statement of lockhooks' own on the inner connection,
// bypassing the hooks, its round trip noted, and returns its first row
// (pgsession.Host).
func (c *conn) QueryRow(ctx context.Context, query string, args []driver.NamedValue) (row []driver.Value, err error) {
	err = c.noteRoundTrip(query, func() error {
		row, err = c.queryFirstRow(ctx, query, args)
		return err
	})
	return row, err
}

// queryFirstRow is QueryRow's round trip.
func (c *conn) queryFirstRow(ctx context.Context, query string, args []driver.NamedValue) ([]driver.Value, error) {
	var rows driver.Rows
	var err error
	if c.queryer != nil {
		rows, err = c.queryer.QueryContext(ctx, query, args)
	} else {
		rows, err = rawconn.Query(ctx, c.inner, query, args)
	}
	if err != nil {
		return nil, c.Observe(err)
	}
	defer rows.Close()
	dest := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(dest); err != nil {
		return nil, c.Observe(err)
	}
	if len(dest) == 0 {
		return nil, fmt.Errorf("lockhooks: %q returned no columns", query)
	}
	return dest, nil
}

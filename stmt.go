package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// stmtColumnConverter is driver.ColumnConverter under a name that does not
// collide with its method: a struct embedding driver.ColumnConverter has a
// field, not a method, called ColumnConverter.
type stmtColumnConverter interface {
	ColumnConverter(idx int) driver.ValueConverter
}

// stmt is a wrapped prepared statement. Its text was rewritten when it was
// prepared; each execution goes through the connection's hooks with the
// classification made then.
type stmt struct {
	c     *conn
	inner driver.Stmt
	st    statement
	query string // as the application wrote it

	execer    driver.StmtExecContext
	queryer   driver.StmtQueryContext
	checker   driver.NamedValueChecker
	converter driver.ColumnConverter
}

// Interface bits of withStmtInterfaces, in generated order.
const (
	stmtExecContextBit uint = 1 << iota
	stmtQueryContextBit
	stmtNamedValueCheckerBit
	stmtColumnConverterBit
)

// newStmt wraps inner with exactly the optional interfaces it has.
func newStmt(c *conn, inner driver.Stmt, query string, st statement) driver.Stmt {
	s := &stmt{c: c, inner: inner, st: st, query: query}
	var mask uint
	if e, ok := inner.(driver.StmtExecContext); ok {
		s.execer = e
		mask |= stmtExecContextBit
	}
	if q, ok := inner.(driver.StmtQueryContext); ok {
		s.queryer = q
		mask |= stmtQueryContextBit
	}
	if n, ok := inner.(driver.NamedValueChecker); ok {
		s.checker = n
		mask |= stmtNamedValueCheckerBit
	}
	if cc, ok := inner.(driver.ColumnConverter); ok { //nolint:staticcheck // forwarded for drivers that have it
		s.converter = cc
		mask |= stmtColumnConverterBit
	}
	return withStmtInterfaces(s, mask)
}

// Close closes the inner statement.
func (s *stmt) Close() error { return s.inner.Close() }

// NumInput forwards to the inner statement.
func (s *stmt) NumInput() int { return s.inner.NumInput() }

// tracked reports whether executions need the lock tracking around them.
func (s *stmt) tracked() bool { return s.st.advisory != nil || s.c.pin.Active.Load() }

// Exec runs the statement; database/sql calls it only when ExecContext is
// absent.
func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	if s.c.needsWriterLock(s.st) {
		if err := s.c.connector.writer.lock(context.Background(), s.c.connector.tel, s.c, s.c.connector.opts.busyTimeout, s.query); err != nil {
			return nil, err
		}
		defer s.c.connector.writer.unlock()
	}
	run := func() (driver.Result, error) { return s.inner.Exec(args) } //nolint:staticcheck // no ExecContext
	if s.tracked() {
		return s.c.execTracked(context.Background(), s.st, rawconn.Named(args), false, func(string, []driver.NamedValue) (driver.Result, error) { return run() })
	}
	res, err := run()
	return res, s.st.explain(s.c.Observe(err))
}

// Query runs the statement; database/sql calls it only when QueryContext is
// absent.
func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	run := func() (driver.Rows, error) { return s.inner.Query(args) } //nolint:staticcheck // no QueryContext
	if s.c.needsWriterLock(s.st) {
		return s.c.queryWriting(context.Background(), s.st, s.query, run)
	}
	if s.tracked() {
		return s.c.queryTracked(context.Background(), s.st, rawconn.Named(args), false, func(string, []driver.NamedValue) (driver.Rows, error) { return run() })
	}
	rows, err := run()
	return rows, s.st.explain(s.c.Observe(err))
}

// ExecContext runs the statement.
func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.c.beforeStatement(s.st, s.query, args)
	if s.c.needsWriterLock(s.st) {
		if err := s.c.connector.writer.lock(ctx, s.c.connector.tel, s.c, s.c.connector.opts.busyTimeout, s.query); err != nil {
			return nil, err
		}
		defer s.c.connector.writer.unlock()
	}
	if s.tracked() {
		return s.c.execTracked(ctx, s.st, args, false, func(string, []driver.NamedValue) (driver.Result, error) { return s.execer.ExecContext(ctx, args) })
	}
	res, err := s.execer.ExecContext(ctx, args)
	return res, s.st.explain(s.c.Observe(err))
}

// QueryContext runs the statement.
func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.beforeStatement(s.st, s.query, args)
	if s.c.needsWriterLock(s.st) {
		return s.c.queryWriting(ctx, s.st, s.query, func() (driver.Rows, error) { return s.queryer.QueryContext(ctx, args) })
	}
	if s.tracked() {
		return s.c.queryTracked(ctx, s.st, args, false, func(string, []driver.NamedValue) (driver.Rows, error) { return s.queryer.QueryContext(ctx, args) })
	}
	rows, err := s.queryer.QueryContext(ctx, args)
	return rows, s.st.explain(s.c.Observe(err))
}

// CheckNamedValue forwards to the inner statement.
func (s *stmt) CheckNamedValue(nv *driver.NamedValue) error { return s.checker.CheckNamedValue(nv) }

// ColumnConverter forwards to the inner statement.
func (s *stmt) ColumnConverter(idx int) driver.ValueConverter {
	return s.converter.ColumnConverter(idx)
}

// markerStmt is Lock's marker statement prepared on a driver without an
// Execer: executing it serves the lock request; nothing is sent.
type markerStmt struct{ c *conn }

func (m markerStmt) Close() error  { return nil }
func (m markerStmt) NumInput() int { return 1 }
func (m markerStmt) Exec(args []driver.Value) (driver.Result, error) {
	return m.c.lockset(context.Background(), rawconn.Named(args))
}
func (m markerStmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("lockhooks: the Lock marker is executed, not queried")
}
func (m markerStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return m.c.lockset(ctx, args)
}

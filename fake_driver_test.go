package lockhooks

import (
	"context"
	"database/sql/driver"
	"io"
	"reflect"
)

// The fake driver tests the wrapper's own plumbing only (which interfaces it
// exposes, what it allocates); database behaviour is tested on real
// databases. Each fake type implements every optional interface; the
// generated fake*With pickers hide the ones a test leaves out.

type fakeDriver struct{ conn func() driver.Conn }

func (d fakeDriver) Open(string) (driver.Conn, error) { return d.conn(), nil }

type fakeConnector struct{ drv driver.Driver }

func (c fakeConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open("") }
func (c fakeConnector) Driver() driver.Driver                        { return c.drv }

type fakeConn struct {
	stmt  func() driver.Stmt
	rows  func() driver.Rows
	valid bool
	// execErr is returned by ExecContext, pingErr by Ping.
	execErr, pingErr error
	calls            []string // which inner methods ran, in order
	quiet            bool     // do not record calls (allocation tests)
}

func newFakeConn() *fakeConn {
	return &fakeConn{
		stmt:  func() driver.Stmt { return &fakeStmt{} },
		rows:  func() driver.Rows { return &fakeRows{} },
		valid: true,
	}
}

func (c *fakeConn) record(m string) {
	if !c.quiet {
		c.calls = append(c.calls, m)
	}
}

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { c.record("Prepare"); return c.stmt(), nil }
func (c *fakeConn) Close() error                        { c.record("Close"); return nil }
func (c *fakeConn) Begin() (driver.Tx, error)           { c.record("Begin"); return fakeTx{}, nil }
func (c *fakeConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	c.record("ExecContext")
	if c.execErr != nil {
		return nil, c.execErr
	}
	return driver.RowsAffected(1), nil
}
func (c *fakeConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	c.record("QueryContext")
	return c.rows(), nil
}
func (c *fakeConn) PrepareContext(context.Context, string) (driver.Stmt, error) {
	c.record("PrepareContext")
	return c.stmt(), nil
}
func (c *fakeConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	c.record("BeginTx")
	return fakeTx{}, nil
}
func (c *fakeConn) Ping(context.Context) error               { c.record("Ping"); return c.pingErr }
func (c *fakeConn) ResetSession(context.Context) error       { c.record("ResetSession"); return nil }
func (c *fakeConn) CheckNamedValue(*driver.NamedValue) error { return driver.ErrSkip }
func (c *fakeConn) IsValid() bool                            { c.record("IsValid"); return c.valid }
func (c *fakeConn) Exec(string, []driver.Value) (driver.Result, error) {
	c.record("Exec")
	return driver.RowsAffected(1), nil
}
func (c *fakeConn) Query(string, []driver.Value) (driver.Rows, error) {
	c.record("Query")
	return c.rows(), nil
}

type fakeTx struct{}

func (fakeTx) Commit() error   { return nil }
func (fakeTx) Rollback() error { return nil }

type fakeStmt struct{}

func (*fakeStmt) Close() error                               { return nil }
func (*fakeStmt) NumInput() int                              { return -1 }
func (*fakeStmt) Exec([]driver.Value) (driver.Result, error) { return driver.RowsAffected(1), nil }
func (*fakeStmt) Query([]driver.Value) (driver.Rows, error)  { return &fakeRows{}, nil }
func (*fakeStmt) CheckNamedValue(*driver.NamedValue) error   { return driver.ErrSkip }
func (*fakeStmt) ColumnConverter(int) driver.ValueConverter  { return driver.DefaultParameterConverter }
func (*fakeStmt) ExecContext(context.Context, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(1), nil
}
func (*fakeStmt) QueryContext(context.Context, []driver.NamedValue) (driver.Rows, error) {
	return &fakeRows{}, nil
}

type fakeRows struct{ done bool }

func (*fakeRows) Columns() []string { return []string{"x"} }
func (*fakeRows) Close() error      { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = int64(1)
	return nil
}
func (*fakeRows) HasNextResultSet() bool                            { return false }
func (*fakeRows) NextResultSet() error                              { return io.EOF }
func (*fakeRows) ColumnTypeScanType(int) reflect.Type               { return reflect.TypeFor[int64]() }
func (*fakeRows) ColumnTypeDatabaseTypeName(int) string             { return "INT8" }
func (*fakeRows) ColumnTypeLength(int) (int64, bool)                { return 0, false }
func (*fakeRows) ColumnTypeNullable(int) (bool, bool)               { return false, true }
func (*fakeRows) ColumnTypePrecisionScale(int) (int64, int64, bool) { return 0, 0, false }

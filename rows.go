package lockhooks

import (
	"context"
	"database/sql/driver"
	"io"
	"reflect"
)

// The optional rows interfaces, each with only its own methods (the
// driver package's versions embed driver.Rows, which would make the
// generated structs' methods ambiguous).
type (
	rowsNextResultSet interface {
		HasNextResultSet() bool
		NextResultSet() error
	}
	rowsColumnTypeScanType         interface{ ColumnTypeScanType(index int) reflect.Type }
	rowsColumnTypeDatabaseTypeName interface{ ColumnTypeDatabaseTypeName(index int) string }
	rowsColumnTypeLength           interface {
		ColumnTypeLength(index int) (length int64, ok bool)
	}
	rowsColumnTypeNullable interface {
		ColumnTypeNullable(index int) (nullable, ok bool)
	}
	rowsColumnTypePrecisionScale interface {
		ColumnTypePrecisionScale(index int) (precision, scale int64, ok bool)
	}
)

// rows wraps the rows of a statement the wrapper must follow to its end:
// one that calls advisory-lock functions, whose effect is known once its
// rows are closed, or an SQLite write that holds the writer lock until
// then. Other statements get the inner rows unwrapped.
type rows struct {
	c      *conn
	inner  driver.Rows
	ctx    context.Context
	plan   advisoryPlan
	writer bool  // the statement holds the SQLite writer lock until Close
	err    error // the first error of Next, for the tracking
	// first is the first row of an advisory target list: the results of
	// its try-locks and unlocks (in firstFew when it has one or two
	// columns: a call, or AcquireAdvisoryLock's call and token).
	first    []driver.Value
	firstFew [2]driver.Value
}

// Interface bits of withRowsInterfaces, in generated order.
const (
	rowsNextResultSetBit uint = 1 << iota
	rowsScanTypeBit
	rowsDatabaseTypeNameBit
	rowsLengthBit
	rowsNullableBit
	rowsPrecisionScaleBit
)

// newRows wraps inner with exactly its optional interfaces.
func newRows(ctx context.Context, c *conn, inner driver.Rows, plan advisoryPlan, writer bool) driver.Rows {
	r := &rows{c: c, inner: inner, ctx: ctx, plan: plan, writer: writer}
	var mask uint
	if _, ok := inner.(rowsNextResultSet); ok {
		mask |= rowsNextResultSetBit
	}
	if _, ok := inner.(rowsColumnTypeScanType); ok {
		mask |= rowsScanTypeBit
	}
	if _, ok := inner.(rowsColumnTypeDatabaseTypeName); ok {
		mask |= rowsDatabaseTypeNameBit
	}
	if _, ok := inner.(rowsColumnTypeLength); ok {
		mask |= rowsLengthBit
	}
	if _, ok := inner.(rowsColumnTypeNullable); ok {
		mask |= rowsNullableBit
	}
	if _, ok := inner.(rowsColumnTypePrecisionScale); ok {
		mask |= rowsPrecisionScaleBit
	}
	return withRowsInterfaces(r, mask)
}

// Columns forwards to the inner rows.
func (r *rows) Columns() []string { return r.inner.Columns() }

// Next forwards to the inner rows and notes a failure that may have broken
// the connection.
func (r *rows) Next(dest []driver.Value) error {
	err := r.inner.Next(dest)
	if err == nil && r.first == nil && r.plan.St.Advisory != nil && r.plan.St.Advisory.TargetList {
		r.first = append(r.firstFew[:0], dest...)
	}
	if err != nil && err != io.EOF {
		r.c.Observe(err)
		if r.err == nil {
			r.err = err
		}
	}
	return err
}

// Close closes the inner rows, then releases the writer lock or brings the
// lock tracking up to date.
func (r *rows) Close() error {
	err := r.c.Observe(r.inner.Close())
	if r.writer {
		r.writer = false
		r.c.connector.writer.unlock()
		return err
	}
	stmtErr := r.err
	if stmtErr == nil {
		stmtErr = err
	}
	if lerr := r.c.afterTracked(r.ctx, r.plan, r.first, stmtErr); lerr != nil && lerr != stmtErr {
		return lerr
	}
	return err
}

// HasNextResultSet forwards to the inner rows.
func (r *rows) HasNextResultSet() bool { return r.inner.(rowsNextResultSet).HasNextResultSet() }

// NextResultSet forwards to the inner rows.
func (r *rows) NextResultSet() error { return r.inner.(rowsNextResultSet).NextResultSet() }

// ColumnTypeScanType forwards to the inner rows.
func (r *rows) ColumnTypeScanType(i int) reflect.Type {
	return r.inner.(rowsColumnTypeScanType).ColumnTypeScanType(i)
}

// ColumnTypeDatabaseTypeName forwards to the inner rows.
func (r *rows) ColumnTypeDatabaseTypeName(i int) string {
	return r.inner.(rowsColumnTypeDatabaseTypeName).ColumnTypeDatabaseTypeName(i)
}

// ColumnTypeLength forwards to the inner rows.
func (r *rows) ColumnTypeLength(i int) (int64, bool) {
	return r.inner.(rowsColumnTypeLength).ColumnTypeLength(i)
}

// ColumnTypeNullable forwards to the inner rows.
func (r *rows) ColumnTypeNullable(i int) (bool, bool) {
	return r.inner.(rowsColumnTypeNullable).ColumnTypeNullable(i)
}

// ColumnTypePrecisionScale forwards to the inner rows.
func (r *rows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	return r.inner.(rowsColumnTypePrecisionScale).ColumnTypePrecisionScale(i)
}

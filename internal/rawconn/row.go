package rawconn

import (
	"database/sql/driver"
	"io"
)

// Row is a statement's answer that lockhooks gives itself (a rerouted
// unlock's, one run on a pooler's holder): one row, or none, as
// driver.Rows.
type Row struct {
	cols []string
	row  []driver.Value
	done bool
}

// OneValue is an answer of one column holding value.
func OneValue(column string, value driver.Value) *Row {
	return &Row{cols: []string{column}, row: []driver.Value{value}}
}

// ReadRow reads the first row of rows, copied out of the driver's
// buffers, and closes rows: once on every path, because a driver's Close
// need not be idempotent (lib/pq's ends its context watch again and
// panics when the statement's context can be cancelled). An answer
// without rows is a Row without one.
func ReadRow(rows driver.Rows) (*Row, error) {
	r := &Row{cols: rows.Columns()}
	dest := make([]driver.Value, len(r.cols))
	if err := rows.Next(dest); err != nil {
		rows.Close()
		if err == io.EOF {
			return r, nil
		}
		return nil, err
	}
	for i, v := range dest {
		if b, ok := v.([]byte); ok {
			dest[i] = append([]byte(nil), b...) // the driver may reuse its buffer
		}
	}
	r.row = dest
	return r, rows.Close()
}

// Values returns the row (nil for a nil answer, or one without a row).
func (r *Row) Values() []driver.Value {
	if r == nil {
		return nil
	}
	return r.row
}

// Columns returns the answer's column names.
func (r *Row) Columns() []string { return r.cols }

// Close does nothing: the driver's rows were closed when read.
func (r *Row) Close() error { return nil }

// Next copies the row into dest once, then reports io.EOF.
func (r *Row) Next(dest []driver.Value) error {
	if r.done || r.row == nil {
		return io.EOF
	}
	r.done = true
	copy(dest, r.row)
	return nil
}

package rawconn

import (
	"context"
	"database/sql/driver"
	"fmt"
)

// Query runs query on c: in the context form when c has it, else
// prepared, the statement closed with its rows.
func Query(ctx context.Context, c driver.Conn, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := c.(driver.QueryerContext); ok {
		return q.QueryContext(ctx, query, args)
	}
	s, err := c.Prepare(query)
	if err != nil {
		return nil, err
	}
	rows, err := StmtQuery(ctx, s, args)
	if err != nil {
		s.Close()
		return nil, err
	}
	return closingRows{Rows: rows, stmt: s}, nil
}

// Exec runs query on c for its effect, as a query whose rows are closed
// unread.
func Exec(ctx context.Context, c driver.Conn, query string) error {
	rows, err := Query(ctx, c, query, nil)
	if err != nil {
		return err
	}
	return rows.Close()
}

// ExecSimple runs a text that may hold several statements on c: through
// its ExecerContext without arguments, which drivers send in the simple
// protocol, else as Exec does.
func ExecSimple(ctx context.Context, c driver.Conn, query string) error {
	if e, ok := c.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, query, nil)
		return err
	}
	return Exec(ctx, c, query)
}

// StmtQuery runs a prepared statement in the context form when it has one.
func StmtQuery(ctx context.Context, s driver.Stmt, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := s.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	values, err := Unnamed(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.Query(values) //nolint:staticcheck // the statement has no QueryContext
}

// closingRows closes its statement after its rows.
type closingRows struct {
	driver.Rows
	stmt driver.Stmt
}

func (r closingRows) Close() error {
	err := r.Rows.Close()
	if cerr := r.stmt.Close(); err == nil {
		err = cerr
	}
	return err
}

// LegacyExecer gives a driver.Execer the ExecerContext form.
type LegacyExecer struct{ driver.Execer } //nolint:staticcheck // legacy drivers

// ExecContext runs the statement unless ctx has ended.
func (e LegacyExecer) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	values, err := Unnamed(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return e.Exec(query, values)
}

// LegacyQueryer gives a driver.Queryer the QueryerContext form.
type LegacyQueryer struct{ driver.Queryer } //nolint:staticcheck // legacy drivers

// QueryContext runs the query unless ctx has ended.
func (q LegacyQueryer) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	values, err := Unnamed(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return q.Query(query, values)
}

// Unnamed converts arguments for legacy driver methods, which cannot take
// named arguments.
func Unnamed(named []driver.NamedValue) ([]driver.Value, error) {
	values := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, fmt.Errorf("lockhooks: the inner driver does not support named arguments (got %q)", nv.Name)
		}
		values[i] = nv.Value
	}
	return values, nil
}

// Named gives legacy arguments their ordinals.
func Named(args []driver.Value) []driver.NamedValue {
	named := make([]driver.NamedValue, len(args))
	for i, v := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return named
}

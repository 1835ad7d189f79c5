package pgdriver

import (
	"database/sql/driver"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
)

// Statements is what a Postgres database's driver allows lockhooks'
// own statements (its BEGIN and COMMIT, and the reads that carry an
// identity): found from the first connection, once.
type Statements struct {
	once     sync.Once
	Simple   bool                // a text of several statements runs in one simple-protocol round trip, uncached
	Args     []driver.NamedValue // the query arguments that select the simple protocol (pgx; lib/pq needs none)
	Exec     []driver.NamedValue // pgx: the first argument that runs a statement with arguments uncached, as sent (QueryExecModeExec)
	IDFirst  bool                // only the first statement's rows come back (pgx)
	PGX      bool                // the connections are pgx's (their TxStatus can be read)
	Disabled atomic.Bool         // the driver did not run such a text as expected: none from now on
}

// Of returns what inner's driver allows, working it out the first time.
func (o *Statements) Of(inner driver.Conn) *Statements {
	o.once.Do(func() {
		t := reflect.TypeOf(inner)
		if t.Kind() != reflect.Pointer {
			return
		}
		switch t.Elem().PkgPath() {
		case "github.com/lib/pq":
			o.Simple = true
		case "github.com/jackc/pgx/v5/stdlib":
			if mode, ok := pgxExecMode(t, "simple protocol"); ok {
				o.Simple, o.IDFirst, o.PGX = true, true, true
				o.Args = []driver.NamedValue{{Ordinal: 1, Value: mode}}
			}
			if mode, ok := pgxExecMode(t, "exec"); ok && o.PGX {
				o.Exec = []driver.NamedValue{{Ordinal: 1, Value: mode}}
			}
		}
	})
	return o
}

// OK reports whether lockhooks' own statements may be composed texts.
func (o *Statements) OK() bool { return o.Simple && !o.Disabled.Load() }

// pgxExecMode finds the pgx QueryExecMode whose String is name (with
// spaces for underscores: "simple protocol" is QueryExecModeSimpleProtocol,
// "exec" QueryExecModeExec) from the type of its stdlib connection: Conn()
// *pgx.Conn, whose Config() has the field DefaultQueryExecMode of type
// QueryExecMode.
func pgxExecMode(stdlibConn reflect.Type, name string) (any, bool) {
	conn, ok := stdlibConn.MethodByName("Conn")
	if !ok || conn.Type.NumOut() != 1 {
		return nil, false
	}
	config, ok := conn.Type.Out(0).MethodByName("Config")
	if !ok || config.Type.NumOut() != 1 || config.Type.Out(0).Kind() != reflect.Pointer {
		return nil, false
	}
	field, ok := config.Type.Out(0).Elem().FieldByName("DefaultQueryExecMode")
	if !ok || field.Type.Kind() != reflect.Int32 || field.Type.PkgPath() != "github.com/jackc/pgx/v5" {
		return nil, false
	}
	for i := range int64(16) {
		v := reflect.New(field.Type).Elem()
		v.SetInt(i)
		if s, ok := v.Interface().(fmt.Stringer); ok && strings.ReplaceAll(s.String(), "_", " ") == name {
			return v.Interface(), true
		}
	}
	return nil, false
}

package pgdriver

import (
	"database/sql/driver"
	"reflect"
)

// DefaultMode returns the DefaultQueryExecMode of the configuration of
// the pgx connection behind a pgx stdlib connection (Conn().Config()), or
// nil.
func DefaultMode(inner driver.Conn) any {
	v, ok := callMethods(inner, "Conn", "Config")
	if !ok {
		return nil
	}
	f := v.Elem().FieldByName("DefaultQueryExecMode")
	if !f.IsValid() || !f.CanInterface() {
		return nil
	}
	return f.Interface()
}

// TxStatuser is pgx's *pgconn.PgConn, as far as lockhooks needs it: the
// transaction status of the server's last ReadyForQuery ('I' idle, 'T' in
// a transaction block, 'E' in a failed one).
type TxStatuser interface{ TxStatus() byte }

// keyDataPIDer is pgx's *pgconn.PgConn as far as the pooler check needs
// it: the process id of the BackendKeyData the server sent at connect. A
// pooler sends one of its own (PgBouncer: random), so it equals
// pg_backend_pid() only on a connection to the server itself.
type keyDataPIDer interface{ PID() uint32 }

// BackendKeyPID returns the process id of the BackendKeyData the server
// (or a pooler) sent inner at connect: pgx's from its PgConn, lib/pq's
// from its connection's processID field (read by reflection, so that the
// root package imports no driver). ok is false for any other driver.
func BackendKeyPID(inner driver.Conn) (pid int64, ok bool) {
	if v, found := callMethods(inner, "Conn", "PgConn"); found {
		if k, isKey := v.Interface().(keyDataPIDer); isKey {
			return int64(k.PID()), true
		}
		return 0, false
	}
	v := reflect.ValueOf(inner)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct || v.Elem().Type().PkgPath() != "github.com/lib/pq" {
		return 0, false
	}
	f := v.Elem().FieldByName("processID")
	if !f.IsValid() || !f.CanInt() {
		return 0, false
	}
	return f.Int(), true
}

// TxStatus returns the pgx connection behind a pgx stdlib connection
// (its Conn().PgConn()), or nil. Called through the interface, TxStatus
// allocates nothing (a method value made by reflect would, at each call).
func TxStatus(inner driver.Conn) TxStatuser {
	v, ok := callMethods(inner, "Conn", "PgConn")
	if !ok {
		return nil
	}
	s, _ := v.Interface().(TxStatuser)
	return s
}

// callMethods calls on v the methods named, each on the result of the one
// before (each takes nothing and returns one pointer), and returns the
// last result; ok is false where a method is missing or returns nil.
func callMethods(v any, names ...string) (reflect.Value, bool) {
	r := reflect.ValueOf(v)
	for _, name := range names {
		m := r.MethodByName(name)
		if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 || m.Type().Out(0).Kind() != reflect.Pointer {
			return reflect.Value{}, false
		}
		if r = m.Call(nil)[0]; r.IsNil() {
			return reflect.Value{}, false
		}
	}
	return r, true
}

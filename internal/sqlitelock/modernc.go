package sqlitelock

import (
	"reflect"
	"unsafe"
)

// What lockhooks knows of modernc.org/sqlite's unexported internals, in one
// place. Each function checks the shape it relies on and reports false when
// a modernc version differs, so lockhooks then takes its slower, driver-
// neutral path; TestModerncInternals fails loudly in that case.

// ModerncPackage is modernc.org/sqlite's import path.
const ModerncPackage = "modernc.org/sqlite"

// ModerncConnectorDSN returns the DSN of a connector (a driver.Connector)
// made by modernc.org/sqlite's NewConnector (an unexported struct with a dsn
// field), so that its _txlock is honoured; ok is false for any other
// connector, or if a later modernc version changes that struct.
func ModerncConnectorDSN(c any) (dsn string, ok bool) {
	f, ok := moderncField(c, "connector", "dsn")
	if !ok {
		return "", false
	}
	return f.String(), true
}

// BeginModerncImmediate makes a new modernc.org/sqlite connection (a
// driver.Conn) begin its write transactions IMMEDIATE, exactly as the DSN
// parameter _txlock=immediate would (modernc keeps that parameter in the
// connection's beginMode field and begins every transaction that is not
// read-only with "BEGIN <beginMode>"), while the driver, its connection
// hooks and its messages keep seeing the DSN the user wrote. It changes only
// a connection whose beginMode is still unset, before database/sql has it,
// and reports whether it did.
func BeginModerncImmediate(c any) bool {
	f, ok := moderncField(c, "conn", "beginMode")
	if !ok || f.String() != "" {
		return false
	}
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().SetString("immediate")
	return true
}

// moderncField returns the string field named field of v, a pointer to
// modernc.org/sqlite's struct typeName; ok is false when v is anything else.
func moderncField(v any, typeName, field string) (f reflect.Value, ok bool) {
	p := reflect.ValueOf(v)
	if p.Kind() != reflect.Pointer || p.IsNil() {
		return reflect.Value{}, false
	}
	s := p.Elem()
	if s.Kind() != reflect.Struct || s.Type().PkgPath() != ModerncPackage || s.Type().Name() != typeName {
		return reflect.Value{}, false
	}
	f = s.FieldByName(field)
	if !f.IsValid() || f.Kind() != reflect.String {
		return reflect.Value{}, false
	}
	return f, true
}

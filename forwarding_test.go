package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// Optional interfaces in the bit order of the generated pickers.
var (
	connOptional = []reflect.Type{
		reflect.TypeFor[driver.ExecerContext](), reflect.TypeFor[driver.QueryerContext](),
		reflect.TypeFor[driver.ConnPrepareContext](), reflect.TypeFor[driver.ConnBeginTx](),
		reflect.TypeFor[driver.Pinger](), reflect.TypeFor[driver.SessionResetter](),
		reflect.TypeFor[driver.NamedValueChecker](),
	}
	// fakeConnOptional adds what only an inner connection may have.
	fakeConnOptional = append(slices.Clip(connOptional),
		reflect.TypeFor[driver.Validator](), reflect.TypeFor[driver.Execer](), reflect.TypeFor[driver.Queryer]())
	stmtOptional = []reflect.Type{
		reflect.TypeFor[driver.StmtExecContext](), reflect.TypeFor[driver.StmtQueryContext](),
		reflect.TypeFor[driver.NamedValueChecker](), reflect.TypeFor[driver.ColumnConverter](),
	}
	rowsOptional = []reflect.Type{
		reflect.TypeFor[driver.RowsNextResultSet](), reflect.TypeFor[driver.RowsColumnTypeScanType](),
		reflect.TypeFor[driver.RowsColumnTypeDatabaseTypeName](), reflect.TypeFor[driver.RowsColumnTypeLength](),
		reflect.TypeFor[driver.RowsColumnTypeNullable](), reflect.TypeFor[driver.RowsColumnTypePrecisionScale](),
	}
)

// implemented returns the bit mask of ifaces that v implements.
func implemented(v any, ifaces []reflect.Type) uint {
	var mask uint
	t := reflect.TypeOf(v)
	for i, it := range ifaces {
		if t.Implements(it) {
			mask |= 1 << i
		}
	}
	return mask
}

// sparseMasks mirrors the generator's sparse families: none, all, each
// interface alone, each left out.
func sparseMasks(n int) []uint {
	all := uint(1)<<n - 1
	ms := []uint{0, all}
	for i := range n {
		ms = append(ms, 1<<i, all&^(1<<i))
	}
	return ms
}

func testConnector(t *testing.T) *connector {
	t.Helper()
	o, err := resolveOptions([]Option{WithDialect(SQLite)})
	if err != nil {
		t.Fatal(err)
	}
	return newConnector(fakeConnector{}, &Driver{}, o, "", sqlitelock.DSN{})
}

// The generated pickers give each mask exactly its interfaces, plus the core.
func TestGeneratedPickersExposeExactlyTheMask(t *testing.T) {
	w := &conn{}
	for mask := range uint(1) << len(connOptional) {
		v := withConnInterfaces(w, mask)
		if got := implemented(v, connOptional); got != mask {
			t.Errorf("conn mask %07b: implements %07b", mask, got)
		}
		if _, ok := v.(connCore); !ok {
			t.Errorf("conn mask %07b: lost Validator or Unwrap", mask)
		}
	}
	s := &stmt{}
	for mask := range uint(1) << len(stmtOptional) {
		if got := implemented(withStmtInterfaces(s, mask), stmtOptional); got != mask {
			t.Errorf("stmt mask %04b: implements %04b", mask, got)
		}
	}
	r := &rows{}
	for mask := range uint(1) << len(rowsOptional) {
		if got := implemented(withRowsInterfaces(r, mask), rowsOptional); got != mask {
			t.Errorf("rows mask %06b: implements %06b", mask, got)
		}
	}
}

// A wrapped connection has an optional interface exactly when the inner one
// does. Exceptions, by design: Validator always (the wrapper must see each
// return to the pool); legacy Execer/Queryer appear as their context forms.
func TestConnExposesExactlyTheInnerInterfaces(t *testing.T) {
	const (
		execerBit  = 8
		queryerBit = 9
	)
	for _, mask := range sparseMasks(len(fakeConnOptional)) {
		inner := fakeConnWith(newFakeConn(), mask)
		if got := implemented(inner, fakeConnOptional); got != mask {
			t.Fatalf("fake conn mask %010b implements %010b: the test double is wrong", mask, got)
		}
		want := mask & (1<<len(connOptional) - 1)
		if mask&(1<<execerBit) != 0 {
			want |= connExecerContext
		}
		if mask&(1<<queryerBit) != 0 {
			want |= connQueryerContext
		}
		w := newConn(testConnector(t), inner)
		if got := implemented(w, connOptional); got != want {
			t.Errorf("inner %010b: wrapper implements %07b, want %07b", mask, got, want)
		}
		if _, ok := w.(driver.Validator); !ok {
			t.Errorf("inner %010b: wrapper lacks Validator", mask)
		}
		if _, ok := w.(driver.Execer); ok { //nolint:staticcheck
			t.Errorf("inner %010b: wrapper advertises the legacy Execer", mask)
		}
		if got := w.(connCore).Unwrap(); got != inner {
			t.Errorf("inner %010b: Unwrap returned %T, want the inner conn", mask, got)
		}
	}
}

func TestStmtExposesExactlyTheInnerInterfaces(t *testing.T) {
	for mask := range uint(1) << len(stmtOptional) {
		fc := newFakeConn()
		inner := fakeStmtWith(&fakeStmt{}, mask)
		if got := implemented(inner, stmtOptional); got != mask {
			t.Fatalf("fake stmt %04b implements %04b: the test double is wrong", mask, got)
		}
		fc.stmt = func() driver.Stmt { return inner }
		w := newConn(testConnector(t), fc).(driver.ConnPrepareContext)
		s, err := w.PrepareContext(context.Background(), "SELECT 1")
		if err != nil {
			t.Fatal(err)
		}
		if got := implemented(s, stmtOptional); got != mask {
			t.Errorf("inner stmt %04b: wrapper implements %04b", mask, got)
		}
	}
}

func TestRowsExposeExactlyTheInnerInterfaces(t *testing.T) {
	c := newConn(testConnector(t), newFakeConn()).(connCore)
	for mask := range uint(1) << len(rowsOptional) {
		inner := fakeRowsWith(&fakeRows{}, mask)
		if got := implemented(inner, rowsOptional); got != mask {
			t.Fatalf("fake rows %06b implement %06b: the test double is wrong", mask, got)
		}
		r := newRows(context.Background(), c.state(), inner, advisoryPlan{}, false)
		if got := implemented(r, rowsOptional); got != mask {
			t.Errorf("inner rows %06b: wrapper implements %06b", mask, got)
		}
	}
}

// database/sql compares driver.ErrSkip with ==; the wrapper must hand it on
// as it is, so that database/sql falls back to a prepared statement.
func TestErrSkipPassesThroughUnwrapped(t *testing.T) {
	fc := newFakeConn()
	fc.execErr = driver.ErrSkip
	w := newConn(testConnector(t), fc)
	if _, err := w.(driver.ExecerContext).ExecContext(context.Background(), "SELECT 1", nil); err != driver.ErrSkip {
		t.Fatalf("ExecContext returned %v, want driver.ErrSkip itself", err)
	}

	db := sql.OpenDB(WrapConnector(fakeConnector{drv: fakeDriver{conn: func() driver.Conn { return fc }}}, WithDialect(SQLite)))
	defer db.Close()
	fc.calls = nil
	if _, err := db.Exec("SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(fc.calls, "PrepareContext") {
		t.Errorf("after ErrSkip database/sql did not fall back to Prepare; inner calls: %v", fc.calls)
	}
}

// Without an inner Validator, IsValid reports true until a call fails with
// an error not from the server, then asks the connection with a Ping.
func TestIsValidProbesAfterAFailure(t *testing.T) {
	fc := newFakeConn()
	const noValidator = (1<<10 - 1) &^ (1 << 7) // every interface but Validator
	w := newConn(testConnector(t), fakeConnWith(fc, noValidator))
	c := w.(connCore)
	if !c.IsValid() {
		t.Fatal("a fresh connection is invalid")
	}
	if slices.Contains(fc.calls, "Ping") {
		t.Fatal("IsValid pinged a healthy connection")
	}

	fc.execErr = serverError{"23505"}
	w.(driver.ExecerContext).ExecContext(context.Background(), "INSERT", nil)
	if !c.IsValid() || slices.Contains(fc.calls, "Ping") {
		t.Fatal("a server error made the connection suspect")
	}

	fc.execErr = errors.New("read tcp: connection reset by peer")
	w.(driver.ExecerContext).ExecContext(context.Background(), "INSERT", nil)
	fc.pingErr = driver.ErrBadConn
	if c.IsValid() {
		t.Fatalf("IsValid is true for a connection that fails its ping; inner calls %v", fc.calls)
	}
	fc.pingErr = nil
	if !c.IsValid() {
		t.Fatal("IsValid is false for a connection that answers its ping")
	}
}

// serverError looks like a Postgres error to the wrapper.
type serverError struct{ code string }

func (e serverError) Error() string    { return "server error " + e.code }
func (e serverError) SQLState() string { return e.code }

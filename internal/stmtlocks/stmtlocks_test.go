package stmtlocks

import (
	"database/sql/driver"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/lockorder"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// valuer is an argument that gives its value through driver.Valuer.
type valuer int64

func (v valuer) Value() (driver.Value, error) { return int64(v), nil }

func TestKeyOf(t *testing.T) {
	for _, c := range []struct {
		query string
		args  []any
		want  advisorykey.Key
		ok    bool
	}{
		{"SELECT pg_advisory_lock(42)", nil, advisorykey.Key{K1: 42}, true},
		{"SELECT pg_advisory_lock($1)", []any{int64(7)}, advisorykey.Key{K1: 7}, true},
		{"SELECT pg_advisory_lock($1)", []any{int32(-3)}, advisorykey.Key{K1: -3}, true},
		{"SELECT pg_advisory_lock($1)", []any{"12"}, advisorykey.Key{K1: 12}, true},
		{"SELECT pg_advisory_lock($1)", []any{valuer(9)}, advisorykey.Key{K1: 9}, true},
		{"SELECT pg_advisory_lock_shared($2, $1)", []any{int64(1), int64(2)}, advisorykey.Key{K1: 2, K2: 1, Pair: true, Shared: true}, true},
		{"SELECT pg_advisory_lock(hashtext('jobs'))", nil, advisorykey.Key{}, false},
		{"SELECT pg_advisory_lock($1)", []any{"twelve"}, advisorykey.Key{}, false},
		{"SELECT pg_advisory_lock($1)", []any{uint64(1 << 63)}, advisorykey.Key{}, false},
		{"SELECT pg_advisory_lock($2)", []any{int64(1)}, advisorykey.Key{}, false},
	} {
		adv := sqlscan.ParseAdvisory(c.query)
		if len(adv.Calls) != 1 {
			t.Fatalf("%s: %d calls", c.query, len(adv.Calls))
		}
		got, ok := KeyOf(adv.Calls[0], named(c.args))
		if ok != c.ok || ok && got != c.want {
			t.Errorf("KeyOf(%s, %v) = %+v, %v; want %+v, %v", c.query, c.args, got, ok, c.want, c.ok)
		}
	}
}

// A key the statement computes is asked of the server as the call would
// compute it: literals and bound parameters as they are, expressions in
// parentheses, each cast as the function takes it; the row becomes the
// key in the call's mode.
func TestEvalQueryAndEvaluatedKey(t *testing.T) {
	for _, c := range []struct {
		query, want string
		row         []driver.Value
		key         advisorykey.Key
	}{
		{"SELECT pg_advisory_lock(hashtext('jobs'))", "SELECT (hashtext('jobs'))::bigint", []driver.Value{int64(-5)}, advisorykey.Key{K1: -5}},
		{"SELECT pg_advisory_xact_lock_shared($1, abs($2))", "SELECT $1::int4, (abs($2))::int4", []driver.Value{int64(1), int32(2)}, advisorykey.Key{K1: 1, K2: 2, Pair: true, Shared: true}},
		{"SELECT pg_try_advisory_lock(7)", "SELECT 7::bigint", []driver.Value{int64(7)}, advisorykey.Key{K1: 7}},
	} {
		call := sqlscan.ParseAdvisory(c.query).Calls[0]
		got, ok := EvalQuery(call)
		if !ok || got != c.want {
			t.Errorf("EvalQuery(%s) = %q, %v; want %q", c.query, got, ok, c.want)
		}
		if k, ok := EvaluatedKey(call, c.row); !ok || k != c.key {
			t.Errorf("EvaluatedKey(%s, %v) = %+v, %v; want %+v", c.query, c.row, k, ok, c.key)
		}
		if _, ok := EvaluatedKey(call, append(c.row, int64(0))); ok {
			t.Errorf("%s: a row of another width was taken", c.query)
		}
		if _, ok := EvaluatedKey(call, nil); ok {
			t.Errorf("%s: no row was taken", c.query)
		}
	}
	if _, ok := EvalQuery(sqlscan.ParseAdvisory("SELECT pg_advisory_unlock_all()").Calls[0]); ok {
		t.Error("a call without a key was evaluated")
	}
}

// named binds args as $1, $2, ….
func named(args []any) []driver.NamedValue {
	out := make([]driver.NamedValue, len(args))
	for i, a := range args {
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	return out
}

// reports collects what the checker found.
type reports []lockorder.Report

func (r *reports) LockOrder(found []lockorder.Report) { *r = append(*r, found...) }

// note runs Note for one statement, as a connection does; tx is nil
// outside a transaction.
func note(query string, args []any, tx *Tx, s *Session, ch *Checker, r Reporter) {
	cl := sqlscan.Classify(query, sqlscan.Postgres, sqlscan.Inspect)
	if tx != nil {
		tx.Mark()
	}
	Note(Statement{Text: query, Args: named(args), Advisory: cl.Advisory, Locks: cl.Locks, Dialect: sqlscan.Postgres}, tx, s, ch, r)
}

func name(k int64) string { return "n" + strconv.FormatInt(k, 10) }

// A transaction's locks are what it asked for before the statement now
// (held) and what the statement asks for (waiting); without the checker a
// session lock and an UPDATE are not tracked, a try-lock never is.
func TestTxDescribe(t *testing.T) {
	var tx Tx
	var s Session
	note("SELECT * FROM accounts WHERE id = $1 FOR UPDATE", []any{1}, &tx, &s, nil, nil)
	note("SELECT pg_advisory_xact_lock(5)", nil, &tx, &s, nil, nil)
	note("SELECT pg_try_advisory_xact_lock(6)", nil, &tx, &s, nil, nil)
	note("SELECT pg_advisory_lock(7)", nil, &tx, &s, nil, nil)
	note("UPDATE accounts SET bal = 0", nil, &tx, &s, nil, nil)
	note("SELECT * FROM orders WHERE id = 2 FOR NO KEY UPDATE", nil, &tx, &s, nil, nil)
	held, waiting := tx.Describe(name)
	wantHeld := []string{"rows of accounts (FOR UPDATE)", "advisory key n5"}
	wantWaiting := []string{"rows of orders (FOR NO KEY UPDATE)"}
	if !reflect.DeepEqual(held, wantHeld) || !reflect.DeepEqual(waiting, wantWaiting) {
		t.Errorf("Describe = %q, %q; want %q, %q", held, waiting, wantHeld, wantWaiting)
	}
	if got := s.Describe(name); got != nil {
		t.Errorf("session locks tracked without the checker: %q", got)
	}
	ids := []string{lockset.IntID(3), lockset.IntID(4)}
	NoteLockset("invoices", ids, &tx, &s, nil, nil)
	if held, waiting := tx.Describe(name); len(held) != 4 || len(waiting) != 0 || held[3] != `lockset "invoices" ids `+lockset.DescribeIDs(ids) {
		t.Errorf("after a granted lockset: %q, %q", held, waiting)
	}
	tx.Reset()
	if held, waiting := tx.Describe(name); held != nil || waiting != nil {
		t.Errorf("after Reset: %q, %q", held, waiting)
	}
}

// With the checker on, opposite orders of two transactions are a cycle,
// reported once; session locks stack, and their unlock, unlock_all and
// DISCARD ALL drop them.
func TestNoteChecksOrder(t *testing.T) {
	ch := NewChecker(name)
	var found reports
	var s Session
	for _, order := range [][2]string{{"accounts", "orders"}, {"orders", "accounts"}, {"orders", "accounts"}} {
		var tx Tx
		note("SELECT * FROM "+order[0]+" WHERE id = 1 FOR UPDATE", nil, &tx, &s, ch, &found)
		note("UPDATE "+order[1]+" SET x = 1 WHERE id = 1", nil, &tx, &s, ch, &found)
	}
	if len(found) != 1 || found[0].Kind != lockorder.Cycle || !reflect.DeepEqual(slices.Sorted(slices.Values(found[0].Classes)), []string{"table accounts", "table orders"}) {
		t.Fatalf("found %+v, want one cycle between table accounts and table orders", found)
	}

	note("SELECT pg_advisory_lock(1)", nil, nil, &s, ch, &found)
	note("SELECT pg_advisory_lock_shared(1)", nil, nil, &s, ch, &found)
	note("SELECT pg_advisory_lock(2)", nil, nil, &s, ch, &found)
	if got, want := s.Describe(name), []string{"advisory key n1 (session)", "advisory key n2 (session)"}; !reflect.DeepEqual(got, want) {
		t.Errorf("session locks %q, want %q", got, want)
	}
	note("SELECT pg_advisory_unlock(1)", nil, nil, &s, ch, &found)
	if got := len(s.Describe(name)); got != 2 {
		t.Errorf("after one unlock of a class held twice: %d classes, want 2", got)
	}
	note("SELECT pg_advisory_unlock_shared(1)", nil, nil, &s, ch, &found)
	if got, want := s.Describe(name), []string{"advisory key n2 (session)"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after both unlocks: %q, want %q", got, want)
	}
	note("DISCARD ALL", nil, nil, &s, ch, &found)
	if got := s.Describe(name); got != nil {
		t.Errorf("after DISCARD ALL: %q", got)
	}
}

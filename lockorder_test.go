package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// reports collects what the checker reports.
type reports struct {
	mu   sync.Mutex
	list []LockOrderReport
}

func (r *reports) add(rep LockOrderReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rep)
}

func (r *reports) of(kind LockOrderKind) []LockOrderReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []LockOrderReport
	for _, rep := range r.list {
		if rep.Kind == kind {
			out = append(out, rep)
		}
	}
	return out
}

// checkedSQLite opens an SQLite database with the checker on.
func checkedSQLite(t *testing.T) (*sql.DB, *reports) {
	t.Helper()
	var got reports
	db := openSQLite(t, WithLockOrderCheck(got.add))
	return db, &got
}

// inTx runs fn in one transaction and commits it.
func inTx(t *testing.T, db *sql.DB, fn func(tx *sql.Tx)) {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	fn(tx)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// mustLock locks and returns its caller's file:line, as the checker
// names call sites.
func mustLock(t *testing.T, tx *sql.Tx, namespace string, ids ...any) string {
	t.Helper()
	if err := Lock(context.Background(), tx, namespace, ids...); err != nil {
		t.Fatal(err)
	}
	_, file, line, _ := runtime.Caller(1)
	return filepath.Base(file) + ":" + fmt.Sprint(line)
}

// TestLockOrderCycleFromOneSequentialRun: two code paths take two lock
// classes in opposite orders, one after the other, in one goroutine: no
// deadlock happens, and the checker still reports the cycle, once, naming
// both classes and the call sites of both orders.
func TestLockOrderCycleFromOneSequentialRun(t *testing.T) {
	db, got := checkedSQLite(t)
	var a1, a2, b1, b2 string
	pathA := func() {
		inTx(t, db, func(tx *sql.Tx) {
			a1 = mustLock(t, tx, "accounts", 1)
			a2 = mustLock(t, tx, "jobs", 5)
		})
	}
	pathB := func() {
		inTx(t, db, func(tx *sql.Tx) {
			b1 = mustLock(t, tx, "jobs", 5)
			b2 = mustLock(t, tx, "accounts", 1)
		})
	}
	pathA()
	pathA()
	if n := len(got.list); n != 0 {
		t.Fatalf("a consistent order was reported: %v", got.list)
	}
	pathB()
	pathB()
	pathA()
	cycles := got.of(LockOrderCycle)
	if len(cycles) != 1 || len(got.list) != 1 {
		t.Fatalf("%d cycle reports, %d reports in all; want one: %v", len(cycles), len(got.list), got.list)
	}
	s := cycles[0].String()
	for _, want := range []string{`lockset "accounts"`, `lockset "jobs"`, a1, a2, b1, b2} {
		if !strings.Contains(s, want) {
			t.Errorf("the report lacks %q:\n%s", want, s)
		}
	}
	t.Log(s)
}

// TestLockOrderConsistentOrderNeverReported: the same order from several
// call sites and transactions, with repeated and nested classes.
func TestLockOrderConsistentOrderNeverReported(t *testing.T) {
	db, got := checkedSQLite(t)
	mustExec(t, db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
	mustExec(t, db, "INSERT INTO accounts VALUES (1, 0), (2, 0)")
	for range 3 {
		inTx(t, db, func(tx *sql.Tx) {
			mustLock(t, tx, "a", 1, 2)
			mustLock(t, tx, "b", 1)
			mustExec(t, tx, "UPDATE accounts SET balance = balance + 1 WHERE id = ?", 1)
			mustExec(t, tx, "UPDATE accounts SET balance = balance + 1 WHERE id = ?", 2)
		})
		inTx(t, db, func(tx *sql.Tx) {
			mustLock(t, tx, "a", 3)
			mustExec(t, tx, "UPDATE accounts SET balance = balance - 1 WHERE id = 1")
		})
		inTx(t, db, func(tx *sql.Tx) {
			mustLock(t, tx, "b", 2)
			mustExec(t, tx, "SELECT * FROM accounts WHERE id = 2 FOR UPDATE")
		})
	}
	if len(got.list) != 0 {
		t.Fatalf("reports for a consistent order: %v", got.list)
	}
}

// TestLockOrderThreeClassCycle: A before B, B before C, C before A, each
// in its own transaction; no two of them conflict, all three deadlock.
func TestLockOrderThreeClassCycle(t *testing.T) {
	db, got := checkedSQLite(t)
	order := func(first, second string) {
		inTx(t, db, func(tx *sql.Tx) {
			mustLock(t, tx, first, 1)
			mustLock(t, tx, second, 1)
		})
	}
	order("A", "B")
	order("B", "C")
	if len(got.list) != 0 {
		t.Fatalf("reported early: %v", got.list)
	}
	order("C", "A")
	order("C", "A")
	order("A", "B")
	cycles := got.of(LockOrderCycle)
	if len(cycles) != 1 {
		t.Fatalf("%d cycle reports, want 1: %v", len(cycles), got.list)
	}
	if c := cycles[0]; len(c.Classes) != 3 || len(c.Edges) != 3 {
		t.Fatalf("cycle %v with edges %v, want three classes", c.Classes, c.Edges)
	}
	for _, want := range []string{`lockset "A"`, `lockset "B"`, `lockset "C"`} {
		if !strings.Contains(cycles[0].String(), want) {
			t.Errorf("no %s in:\n%s", want, cycles[0])
		}
	}
	t.Log(cycles[0])
}

// TestLockOrderDescendingIDs: the transfer in the other direction, by
// separate calls (Lock ids, and UPDATE … WHERE id = $n), is a warning;
// ascending or one-call orders are not.
func TestLockOrderDescendingIDs(t *testing.T) {
	db, got := checkedSQLite(t)
	mustExec(t, db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
	mustExec(t, db, "INSERT INTO accounts VALUES (1, 100), (2, 100)")
	transfer := func(from, to int) {
		inTx(t, db, func(tx *sql.Tx) {
			mustExec(t, tx, "UPDATE accounts SET balance = balance - 10 WHERE id = ?", from)
			mustExec(t, tx, "UPDATE accounts SET balance = balance + 10 WHERE id = ?", to)
		})
	}
	transfer(1, 2)
	inTx(t, db, func(tx *sql.Tx) {
		mustLock(t, tx, "accounts", 2, 1) // one call: sorted
		mustLock(t, tx, "accounts", 3)
	})
	if len(got.list) != 0 {
		t.Fatalf("ascending orders reported: %v", got.list)
	}
	transfer(2, 1)
	transfer(2, 1)
	var site string
	inTx(t, db, func(tx *sql.Tx) {
		mustLock(t, tx, "accounts", 7)
		site = mustLock(t, tx, "accounts", 4)
	})
	warnings := got.of(DescendingIDs)
	if len(warnings) != 2 {
		t.Fatalf("%d warnings, want one for the rows and one for Lock: %v", len(warnings), got.list)
	}
	if s := warnings[0].String(); !strings.Contains(s, "table accounts") || !strings.Contains(s, "id 1 after id 2") {
		t.Errorf("the row warning: %s", s)
	}
	if s := warnings[1].String(); !strings.Contains(s, `lockset "accounts"`) || !strings.Contains(s, "id 4 after id 7") || !strings.Contains(s, site) {
		t.Errorf("the Lock warning: %s", s)
	}
	t.Log(warnings[0])
}

// TestLockOrderUnorderedRowLock: FOR UPDATE over several rows without
// ORDER BY is a warning; with ORDER BY, or over one row, it is not.
func TestLockOrderUnorderedRowLock(t *testing.T) {
	db, got := checkedSQLite(t)
	mustExec(t, db, "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT)")
	mustExec(t, db, "INSERT INTO jobs VALUES (1, 'new'), (2, 'new'), (3, 'done')")
	query := func(q string) {
		inTx(t, db, func(tx *sql.Tx) {
			rows, err := tx.Query(q)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
			}
			rows.Close()
		})
	}
	query("SELECT id FROM jobs WHERE state = 'new' ORDER BY id FOR UPDATE")
	query("SELECT id FROM jobs WHERE id = 1 FOR UPDATE")
	if len(got.list) != 0 {
		t.Fatalf("reported: %v", got.list)
	}
	query("SELECT id FROM jobs WHERE state = 'new' FOR NO KEY UPDATE")
	query("SELECT id FROM jobs WHERE state = 'new' FOR NO KEY UPDATE")
	w := got.of(UnorderedRowLock)
	if len(w) != 1 || !strings.Contains(w[0].String(), "table jobs: 2 rows locked") {
		t.Fatalf("warnings %v", got.list)
	}
	t.Log(w[0])
}

// TestLockOrderPostgres: tables of row-locking statements, transaction
// advisory keys and a session advisory lock held by the connection form
// one graph on Postgres.
func TestLockOrderPostgres(t *testing.T) {
	var got reports
	db := openPG(t, WithLockOrderCheck(got.add))
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
	mustExec(t, db, "CREATE TABLE audit (id SERIAL PRIMARY KEY, account INTEGER)")
	mustExec(t, db, "INSERT INTO accounts VALUES (1, 0), (2, 0)")
	mustExec(t, db, "INSERT INTO audit (account) VALUES (1)")

	inTx(t, db, func(tx *sql.Tx) {
		mustExec(t, tx, "SELECT balance FROM accounts WHERE id = $1 FOR UPDATE", 1)
		mustExec(t, tx, "DELETE FROM audit WHERE account = $1", 1)
	})
	inTx(t, db, func(tx *sql.Tx) {
		mustExec(t, tx, "SELECT pg_advisory_xact_lock(99)")
		mustExec(t, tx, "UPDATE accounts SET balance = 1 WHERE id = 2")
	})
	if len(got.list) != 0 {
		t.Fatalf("reported: %v", got.list)
	}
	// The session lock on key 7 is held by the connection while its
	// transaction locks audit rows and then key 99: audit -> 99 closes
	// accounts -> audit -> 99 -> accounts.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, "SELECT pg_advisory_lock(7)")
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, "UPDATE audit SET account = 2 WHERE id = 1")
	mustExec(t, tx, "SELECT pg_advisory_xact_lock(99)")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, "SELECT pg_advisory_unlock(7)")
	conn.Close()
	cycles := got.of(LockOrderCycle)
	if len(cycles) != 1 || len(cycles[0].Classes) != 3 {
		t.Fatalf("cycles %v (all %v), want one of three classes", cycles, got.list)
	}
	for _, want := range []string{"table accounts", "table audit", "advisory key 99"} {
		if !strings.Contains(cycles[0].String(), want) {
			t.Errorf("no %s in:\n%s", want, cycles[0])
		}
	}
	// audit before session key 7, against key 7 (session) before audit.
	inTx(t, db, func(tx *sql.Tx) {
		mustExec(t, tx, "UPDATE audit SET account = 1 WHERE id = 1")
		mustExec(t, tx, "SELECT pg_advisory_lock(7)")
		mustExec(t, tx, "SELECT pg_advisory_unlock(7)")
		mustExec(t, tx, "SELECT pg_advisory_xact_lock(99)") // the known order again
	})
	cycles = got.of(LockOrderCycle)
	if len(cycles) != 2 || len(got.list) != 2 {
		t.Fatalf("reports %v, want the two cycles", got.list)
	}
	if s := cycles[1].String(); !strings.Contains(s, "advisory key 7") || !strings.Contains(s, "table audit") {
		t.Errorf("cycle: %s", s)
	}
	t.Log(cycles[0])
	t.Log(cycles[1])
}

// TestLockOrderOffCostsNothing: without the option nothing is recorded
// beyond the transaction's own lock list.
func TestLockOrderOff(t *testing.T) {
	db := openSQLite(t)
	inTx(t, db, func(tx *sql.Tx) {
		mustLock(t, tx, "b", 1)
		mustLock(t, tx, "a", 1)
	})
	inTx(t, db, func(tx *sql.Tx) {
		mustLock(t, tx, "a", 1)
		mustLock(t, tx, "b", 1)
	})
	if n := testing.AllocsPerRun(20, func() { WithLockOrderCheck(nil)(&options{}) }); n != 0 {
		t.Errorf("WithLockOrderCheck(nil) allocates %v", n)
	}
}

// TestLockOrderPreparedStatements: statements prepared up front go
// through the same tracking.
func TestLockOrderPreparedStatements(t *testing.T) {
	db, got := checkedSQLite(t)
	mustExec(t, db, "CREATE TABLE a (id INTEGER PRIMARY KEY, v INTEGER)")
	mustExec(t, db, "CREATE TABLE b (id INTEGER PRIMARY KEY, v INTEGER)")
	updA, err := db.Prepare("UPDATE a SET v = 1 WHERE id = ?")
	if err != nil {
		t.Fatal(err)
	}
	defer updA.Close()
	updB, err := db.Prepare("DELETE FROM b WHERE id = ?")
	if err != nil {
		t.Fatal(err)
	}
	defer updB.Close()
	for _, order := range [][2]*sql.Stmt{{updA, updB}, {updB, updA}} {
		inTx(t, db, func(tx *sql.Tx) {
			for _, st := range order {
				if _, err := tx.Stmt(st).Exec(1); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	if c := got.of(LockOrderCycle); len(c) != 1 || !strings.Contains(c[0].String(), "table a") || !strings.Contains(c[0].String(), "table b") {
		t.Fatalf("reports %v", got.list)
	}
}

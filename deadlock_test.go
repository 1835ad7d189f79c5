package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// deadlockBetween runs a deadlock between a transaction on a and one on b
// (two *sql.DB of this process): each runs its first statement, then both
// run their second at once. It returns the victim's *DeadlockError and the
// lines where the two transactions began.
func deadlockBetween(t *testing.T, a, b *sql.DB, first, second [2]string, ctxOf func(context.Context) context.Context) (*DeadlockError, [2]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var began [2]string
	began[0] = nextLine(t)
	ta, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ta.Rollback()
	began[1] = nextLine(t)
	tb, err := b.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Rollback()
	txs := [2]*sql.Tx{ta, tb}
	for i, tx := range txs {
		mustExec(t, tx, "SET LOCAL deadlock_timeout = '20ms'")
		if _, err := tx.ExecContext(ctxOf(ctx), first[i]); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, tx := range txs {
		wg.Go(func() {
			_, errs[i] = tx.ExecContext(ctxOf(ctx), second[i])
			if errs[i] != nil {
				tx.Rollback() // the victim ends: the other side goes on
			}
		})
	}
	wg.Wait()
	var de *DeadlockError
	if err := errors.Join(errs...); !errors.As(err, &de) || !IsDeadlock(err) {
		t.Fatalf("no DeadlockError: %v", err)
	}
	return de, began
}

// twoDatabases opens one Postgres database twice, as two replicas of a
// service in one process.
func twoDatabases(t *testing.T) (*sql.DB, *sql.DB) {
	t.Helper()
	dsn := pgtest.DSN(t)
	var dbs [2]*sql.DB
	for i := range dbs {
		db, err := Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		dbs[i] = db
	}
	return dbs[0], dbs[1]
}

// checkSides: both sides of the cycle are named with their database, the
// line where their transaction began, how long it ran, what it waited for
// and its statement.
func checkSides(t *testing.T, de *DeadlockError, began [2]string) {
	t.Helper()
	if len(de.Sides) != 2 {
		t.Fatalf("sides: %+v", de.Sides)
	}
	this := 0
	for _, s := range de.Sides {
		if s.This {
			this++
		}
		if !strings.Contains(s.Who, "connection #") || !strings.Contains(s.Who, " of \"") || s.Ran <= 0 || s.WaitedFor == "" || s.Statement == "" || s.BlockedBy == 0 {
			t.Errorf("side %+v lacks its identity, duration, wait or statement", s)
		}
		if !strings.HasSuffix(s.Site, began[0]) && !strings.HasSuffix(s.Site, began[1]) {
			t.Errorf("side %d began at %q, want one of %v", s.PID, s.Site, began)
		}
	}
	if this != 1 || de.Sides[0].Site == de.Sides[1].Site {
		t.Errorf("want one victim and two call sites: %+v", de.Sides)
	}
	msg := de.Error()
	for _, want := range []string{"DETAIL: Process", began[0], began[1], "this transaction, on connection #", "the other side, connection #"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the message lacks %q: %s", want, msg)
		}
	}
}

// Two transactions of two databases of this process update two rows in
// opposite orders: the error explains both sides and advises one order.
func TestDeadlockRowsInOppositeOrder(t *testing.T) {
	a, b := twoDatabases(t)
	mustExec(t, a, "CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
	mustExec(t, a, "INSERT INTO accounts VALUES (1, 100), (2, 100)")
	same := func(ctx context.Context) context.Context { return ctx }
	de, began := deadlockBetween(t, a, b,
		[2]string{"UPDATE accounts SET balance = balance - 1 WHERE id = 1", "UPDATE accounts SET balance = balance - 1 WHERE id = 2"},
		[2]string{"UPDATE accounts SET balance = balance + 1 WHERE id = 2", "UPDATE accounts SET balance = balance + 1 WHERE id = 1"}, same)
	checkSides(t, de, began)
	if !strings.Contains(de.Advice, "opposite orders") || !strings.Contains(de.Advice, "WithLockOrderCheck") || strings.Contains(de.Advice, "foreign-key") {
		t.Errorf("advice: %s", de.Advice)
	}
	var victim DeadlockSide
	for _, s := range de.Sides {
		if s.This {
			victim = s
		}
	}
	if !strings.Contains(victim.WaitedFor, "of accounts") {
		t.Errorf("the victim waited for %q, want the row of accounts", victim.WaitedFor)
	}
	// The page's event keeps the whole text.
	c := connectorOf(t, a)
	if victim.Who != "" && !strings.Contains(victim.Who, c.Pool+"\"") {
		c = connectorOf(t, b)
	}
	events, _ := c.Events.Snapshot()
	found := false
	for _, e := range events {
		found = found || e.Kind == eventDeadlock && e.Message == de.Error()
	}
	if !found {
		t.Errorf("no deadlock event with the whole text among %+v", events)
	}
	t.Log(de)
}

// A parent row kept FOR UPDATE (KeepForUpdate) against a foreign-key check
// of a child insert: the advice is the rewrite, whichever side is the
// victim.
func TestDeadlockForeignKeyAgainstKeptForUpdate(t *testing.T) {
	a, b := twoDatabases(t)
	mustExec(t, a, "CREATE TABLE parent (id int PRIMARY KEY, v int)")
	mustExec(t, a, "CREATE TABLE child (id serial PRIMARY KEY, parent_id int NOT NULL REFERENCES parent (id))")
	mustExec(t, a, "INSERT INTO parent VALUES (1, 0), (2, 0)")
	de, began := deadlockBetween(t, a, b,
		[2]string{"SELECT v FROM parent WHERE id = 1 FOR UPDATE", "UPDATE parent SET v = v + 1 WHERE id = 2"},
		[2]string{"SELECT v FROM parent WHERE id = 2 FOR UPDATE", "INSERT INTO child (parent_id) VALUES (1)"}, KeepForUpdate)
	checkSides(t, de, began)
	if !strings.Contains(de.Advice, "foreign-key check") || !strings.Contains(de.Advice, "KeepForUpdate") || !strings.Contains(de.Advice, "FOR NO KEY UPDATE") {
		t.Errorf("advice: %s", de.Advice)
	}
	t.Log(de)
}

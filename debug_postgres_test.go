package lockhooks

// /debug/locks and the slow-wait log on Postgres: a blocker in another session,
// events, lockset names and row waits.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/lockset"
)

// Postgres: a lock held by another process; the waiter's row names the
// blocking backend, its application_name and statement, never its
// arguments.
func TestDebugHandlerPostgresBlocker(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	srv := httptest.NewServer(DebugHandler(e.wrapped))
	defer srv.Close()
	const secret = "s3cret-pg-argument"
	blocker, pid := rawBlocker(t, e.raw, 7001, secret)
	defer blocker.Close()

	own, err := AcquireAdvisoryLock(ctx, e.wrapped, 7002) // held in-process
	if err != nil {
		t.Fatal(err)
	}
	defer own.Release(ctx)
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := AcquireAdvisoryLock(waitCtx, e.wrapped, 7001)
		done <- err
	}()
	rep, body := waitForWaiters(t, srv, 1)
	var w debugpage.Waiter
	waitFor(t, 10*time.Second, "the blocker on the page", func() bool {
		rep, body = debugJSON(t, srv)
		for _, x := range rep.Databases[0].Waiters {
			if x.Kind == "advisory" && len(x.Blockers) > 0 {
				w = x
				return true
			}
		}
		return false
	})
	if w.Keys != "7001" || w.PID == 0 || w.Blockers[0].PID != pid || w.Blockers[0].ApplicationName != "lockhooks_debug_blocker" ||
		!strings.Contains(w.Blockers[0].Query, "pg_advisory_lock") || w.Blockers[0].State != "idle" {
		t.Errorf("waiter: %+v", w)
	}
	if strings.Contains(body, secret) {
		t.Errorf("an argument is shown:\n%s", body)
	}
	if w.Blockers[0].XactSeconds != -1 || strings.Contains(body, `"xact_age_seconds": -1`) {
		t.Errorf("an idle blocker's transaction age is not left out: %v\n%s", w.Blockers[0].XactSeconds, body)
	}
	d := rep.Databases[0]
	if len(d.Held) != 1 || d.Held[0].Key != "7002" || d.Held[0].PID == 0 || d.Held[0].Scope != "session" {
		t.Errorf("held: %+v", d.Held)
	}
	found := false
	for _, edge := range d.Graph.Edges {
		found = found || edge.From == fmt.Sprintf("conn-%d", w.Conn) && edge.To == fmt.Sprintf("pid-%d", pid)
	}
	if !found {
		t.Errorf("no edge to the blocker: %+v", d.Graph)
	}
	if page := getDebug(t, srv.URL); strings.Contains(page, secret) || !strings.Contains(page, "lockhooks_debug_blocker") {
		t.Error("the page shows an argument, or not the blocker")
	}
	cancel()
	<-done
}

// rawBlocker holds advisory lock key on a connection of raw (another
// "process" to lockhooks), with application_name set; its statement has a
// bound argument that must never be shown.
func rawBlocker(t testing.TB, raw *sql.DB, key int64, secret string) (*sql.Conn, int32) {
	t.Helper()
	return rawBlockerOf(t, raw, "pg_advisory_lock($1)", key, secret)
}

// rawBlockerOf is rawBlocker for the lock that call takes (its $1 is key).
func rawBlockerOf(t testing.TB, raw *sql.DB, call string, key int64, secret string) (*sql.Conn, int32) {
	t.Helper()
	ctx := context.Background()
	c, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "SET application_name = 'lockhooks_debug_blocker'"); err != nil {
		t.Fatal(err)
	}
	var pid int32
	var got string
	if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid(), $2::text FROM (SELECT "+call+") AS l", key, secret).Scan(&pid, &got); err != nil {
		t.Fatal(err)
	}
	return c, pid
}

// A Postgres wait on a lock another process holds logs the blocking pid.
func TestSlowLockLogPostgres(t *testing.T) {
	buf := &syncBuffer{}
	e := newPinEnv(t, slowLogOptions(buf, 50*time.Millisecond)...)
	ctx := context.Background()
	blocker, pid := rawBlocker(t, e.raw, 8001, "unused")
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(ctx, e.wrapped, 8001)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	waitFor(t, 10*time.Second, "the still-waiting line", func() bool { return strings.Contains(buf.String(), "still waiting") })
	log := buf.String()
	if !strings.Contains(log, fmt.Sprintf("blocking_pids=%d", pid)) || !strings.Contains(log, "lockhooks_debug_blocker") || !strings.Contains(log, "keys=8001") {
		t.Errorf("the line does not name the blocking pid %d:\n%s", pid, log)
	}
	if _, err := blocker.ExecContext(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	blocker.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the ended line", func() bool { return strings.Contains(buf.String(), "slow lock wait: ended") })
	log = buf.String()
	if strings.Count(log, "still waiting") != 1 || strings.Count(log, "slow lock wait: ended") != 1 {
		t.Errorf("want one line of each:\n%s", log)
	}
}

// The events the page lists come from the report points: a parked lock
// whose unlock is rerouted, an unlock nobody can honour, a holder whose
// backend is terminated.
func TestDebugHandlerPostgresEvents(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	srv := httptest.NewServer(DebugHandler(e.wrapped))
	defer srv.Close()

	mustExec(t, e.wrapped, "SELECT pg_advisory_lock(9101)") // parked
	rep, _ := debugJSON(t, srv)
	if h := rep.Databases[0].Held; len(h) != 1 || h[0].Key != "9101" || h[0].State != "parked" || h[0].PID == 0 {
		t.Errorf("held: %+v", h)
	}
	if ok, err := unlock(t, e.wrapped, 9101); !ok || err != nil { // rerouted
		t.Fatal(ok, err)
	}
	if _, err := unlock(t, e.wrapped, 9101); !errors.Is(err, ErrNotLockOwner) { // refused
		t.Fatalf("second unlock: %v", err)
	}
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 9102)
	if err != nil {
		t.Fatal(err)
	}
	terminate(t, e.raw, pidOf(t, l.Conn()))
	<-l.Lost() // after the log and the count
	rep, body := debugJSON(t, srv)
	d := rep.Databases[0]
	kinds := map[string]int{}
	for _, ev := range d.Events {
		kinds[ev.Kind]++
	}
	for _, k := range []string{eventUnlockRerouted, eventUnlockRefused, eventLockLost} {
		if kinds[k] != 1 || d.Counters[k] != 1 {
			t.Errorf("event %s: %d listed, counter %d:\n%s", k, kinds[k], d.Counters[k], body)
		}
	}
	if page := getDebug(t, srv.URL); !strings.Contains(page, "unlock_rerouted") || !strings.Contains(page, "lock_lost") {
		t.Error("the page does not list the events")
	}
	l.Release(ctx)
}

// On Postgres, Lock's keys are advisory keys derived from (namespace, id):
// the page shows them as Lock's namespace and id, with where and when the
// transaction took them, also when it was opened after they were taken.
func TestDebugHandlerPostgresLocksetNames(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	tx, err := e.wrapped.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := Lock(ctx, tx, "<orders>", 17); err != nil { // the site shown
		t.Fatal(err)
	}
	srv := httptest.NewServer(DebugHandler(e.wrapped))
	defer srv.Close()
	rep, _ := debugJSON(t, srv)
	h := rep.Databases[0].Held
	if len(h) != 1 || h[0].Kind != "lockset" || h[0].Scope != "transaction" || h[0].Namespace != "<orders>" || h[0].Key != "17" ||
		h[0].AdvisoryKey != fmt.Sprint(LockID("<orders>\x00"+lockset.IntID(17))) || !strings.Contains(h[0].Site, "debug_postgres_test.go:") || h[0].Since.IsZero() {
		t.Errorf("held: %+v", h)
	}
	if g := rep.Databases[0].HeldGroups; len(g) != 1 || g[0].Kind != "lockset" || g[0].Namespace != "<orders>" || g[0].Count != 1 {
		t.Errorf("groups: %+v", g)
	}
	if page := getDebug(t, srv.URL); !strings.Contains(page, "&lt;orders&gt;") || !strings.Contains(page, "key "+h[0].AdvisoryKey) {
		t.Error("the page does not name the key")
	}
}

// Postgres row locks: a SELECT … FOR UPDATE that waits for a row another
// connection of this database locked is a "row" waiter whose blocker is
// that connection; an UPDATE waiting for the same row, which lockhooks
// does not time, is listed from the server's view, as kind "server".
func TestDebugHandlerPostgresRowWaits(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	srv := httptest.NewServer(DebugHandler(e.wrapped))
	defer srv.Close()
	mustExec(t, e.wrapped, "CREATE TABLE items (id int PRIMARY KEY, v int)")
	mustExec(t, e.wrapped, "INSERT INTO items VALUES (1, 0)")
	holderTx, err := e.wrapped.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holderTx.Rollback()
	var v int
	if err := holderTx.QueryRowContext(ctx, "SELECT v FROM items WHERE id = $1 FOR UPDATE", 1).Scan(&v); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() {
		tx, err := e.wrapped.BeginTx(waitCtx, nil)
		if err == nil {
			err = tx.QueryRowContext(waitCtx, "SELECT v FROM items WHERE id = $1 FOR UPDATE", 1).Scan(new(int))
			tx.Rollback()
		}
		errs <- err
	}()
	go func() {
		_, err := e.wrapped.ExecContext(waitCtx, "UPDATE items SET v = v + $1 WHERE id = 1", 424242)
		errs <- err
	}()
	var row, server debugpage.Waiter
	var rep debugpage.Report // one report for every check below: holders and edges of one moment
	var body string
	waitFor(t, 10*time.Second, "both waiters with their blockers", func() bool {
		rep, body = debugJSON(t, srv)
		row, server = debugpage.Waiter{}, debugpage.Waiter{}
		for _, w := range rep.Databases[0].Waiters {
			switch {
			case w.Kind == "row" && len(w.Holders) > 0:
				row = w
			case w.Kind == "server" && len(w.Holders) > 0:
				server = w
			}
		}
		return row.Conn != 0 && server.Conn != 0
	})
	// The blocking backends are connections of this process: holders with
	// their identity (database, connection, pid), not outside pids; the
	// transaction that locked the row first is named with where it began.
	// (Which waiter queues behind which is the server's choice.)
	var root holders.Holder
	for _, w := range []debugpage.Waiter{row, server} {
		if len(w.Blockers) != 0 {
			t.Errorf("waiter with outside blockers: %+v", w)
		}
		for _, h := range w.Holders {
			if h.Conn == 0 || h.PID == 0 || h.Database == "" {
				t.Errorf("holder without its identity: %+v", h)
			}
			if h.Conn != row.Conn && h.Conn != server.Conn {
				root = h
			}
		}
	}
	if !strings.Contains(root.Site, "debug_postgres_test.go:") || root.SiteKind != holders.SiteBegan || root.Since.IsZero() {
		t.Errorf("the transaction holding the row: %+v", root)
	}
	if row.Mode != "for_no_key_update" || !strings.Contains(row.Statement, "FOR NO KEY UPDATE") {
		t.Errorf("row waiter: %+v", row)
	}
	if !strings.Contains(server.Statement, "UPDATE items") || strings.Contains(server.Statement, "424242") || !strings.HasPrefix(server.WaitEvent, "Lock/") ||
		server.WaitSeconds <= 0 || server.Since.IsZero() {
		t.Errorf("server waiter (with how long it waits): %+v", server)
	}
	if strings.Contains(body, "424242") {
		t.Errorf("an argument is shown:\n%s", body)
	}
	// The graph draws who waits directly for whom: the row waiter's edge
	// goes to one of its holders (the root, or the waiter queued ahead).
	found := false
	for _, edge := range rep.Databases[0].Graph.Edges {
		for _, h := range row.Holders {
			found = found || edge.From == fmt.Sprintf("conn-%d", row.Conn) && edge.To == fmt.Sprintf("conn-%d", h.Conn)
		}
	}
	if !found {
		t.Errorf("no edge from the row waiter to one of its holders %+v: %+v", row.Holders, rep.Databases[0].Graph.Edges)
	}
	cancel()
	<-errs
	<-errs
}

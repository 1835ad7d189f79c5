package lockhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// getDebug fetches url and returns the body, failing on a non-200.
func getDebug(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return string(body)
}

// debugJSON fetches the page's JSON.
func debugJSON(t testing.TB, srv *httptest.Server) (debugReport, string) {
	t.Helper()
	body := getDebug(t, srv.URL+"?format=json")
	var rep debugReport
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	return rep, body
}

// waitForWaiters polls the JSON until database 0 shows n waiters.
func waitForWaiters(t testing.TB, srv *httptest.Server, n int) (debugReport, string) {
	t.Helper()
	var rep debugReport
	var body string
	waitFor(t, 10*time.Second, fmt.Sprintf("%d waiters on the debug page", n), func() bool {
		rep, body = debugJSON(t, srv)
		return len(rep.Databases) > 0 && len(rep.Databases[0].Waiters) >= n
	})
	return rep, body
}

// An SQLite advisory lock held and one waited for: the JSON names the
// holder's connection and call site, the waiter and its holder, and the
// graph has the edge between them.
func TestDebugHandlerSQLiteJSON(t *testing.T) {
	db := openSQLite(t)
	ctx := context.Background()
	srv := httptest.NewServer(DebugHandler(db))
	defer srv.Close()

	held, err := AcquireAdvisoryLock(ctx, db, 42) // the holder's call site
	if err != nil {
		t.Fatal(err)
	}
	holder := trackedConn(t, held.Conn())
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(waitCtx, db, 42)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	rep, body := waitForWaiters(t, srv, 1)
	d := rep.Databases[0]
	if d.Dialect != "sqlite" || d.Error != "" {
		t.Fatalf("database: %+v", d)
	}
	if len(d.Held) != 1 {
		t.Fatalf("held: %+v", d.Held)
	}
	h := d.Held[0]
	if h.Kind != "advisory" || h.Key != "42" || h.Conn != holder.id || h.Count != 1 || h.State != "in use" ||
		!strings.Contains(h.Site, "debug_test.go:") || h.Since.IsZero() {
		t.Errorf("held lock: %+v", h)
	}
	w := d.Waiters[0]
	if w.Kind != "advisory" || w.Keys != "42" || w.Conn == 0 || w.Conn == holder.id || !strings.Contains(w.Site, "debug_test.go:") {
		t.Errorf("waiter: %+v", w)
	}
	if len(w.Holders) != 1 || w.Holders[0].Conn != holder.id || w.Holders[0].Site != h.Site {
		t.Errorf("waiter's holders: %+v", w.Holders)
	}
	want := debugEdge{From: fmt.Sprintf("conn-%d", w.Conn), To: fmt.Sprintf("conn-%d", holder.id)}
	if len(d.Graph.Edges) != 1 || d.Graph.Edges[0].From != want.From || d.Graph.Edges[0].To != want.To || d.Graph.Cycle {
		t.Errorf("graph: %+v, want the edge %s -> %s", d.Graph, want.From, want.To)
	}
	// The JSON's field names are the documented ones.
	for _, field := range []string{`"generated"`, `"databases"`, `"held"`, `"waiters"`, `"graph"`, `"events"`, `"counters"`,
		`"kind"`, `"mode"`, `"scope"`, `"key"`, `"conn"`, `"state"`, `"since"`, `"site"`, `"count"`, `"holders"`, `"blockers"`,
		`"wait_seconds"`, `"nodes"`, `"edges"`, `"waits_in_progress"`} {
		if !strings.Contains(body, field) {
			t.Errorf("JSON lacks %s:\n%s", field, body)
		}
	}
	if d.Counters["waits_in_progress"] != 1 {
		t.Errorf("counters: %v", d.Counters)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rep, _ = debugJSON(t, srv)
	if d := rep.Databases[0]; len(d.Held) != 0 || len(d.Waiters) != 0 || len(d.Graph.Edges) != 0 {
		t.Errorf("after release: %+v", d)
	}
}

// Namespaces, ids and statement text are untrusted: the HTML escapes them,
// and no bound argument appears anywhere.
func TestDebugHandlerEscapesAndHidesArguments(t *testing.T) {
	db := openSQLite(t)
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE t (v TEXT)")
	srv := httptest.NewServer(DebugHandler(db))
	defer srv.Close()

	const ns = `<script>alert(1)</script>`
	const id = `"><img src=x onerror=alert(3)>`
	const secret = "s3cret-argument-value"
	const stmt = `INSERT INTO t (v) VALUES (?) /* <b onmouseover=alert(2)>x</b> */`

	holder, err := db.BeginTx(ctx, nil) // holds the writer lock
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if err := Lock(ctx, holder, ns, id); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, "INSERT INTO t (v) VALUES (?)", secret); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { // waits for the writer lock, with an argument
		_, err := db.ExecContext(ctx, stmt, secret)
		errs <- err
	}()
	go func() { // waits for the lockset, in a read-only transaction
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			errs <- err
			return
		}
		defer tx.Rollback()
		errs <- Lock(ctx, tx, ns, id)
	}()
	_, body := waitForWaiters(t, srv, 2)
	page := getDebug(t, srv.URL+"?refresh=0")
	for _, out := range []string{body, page} {
		if strings.Contains(out, secret) {
			t.Errorf("an argument value is shown:\n%s", out)
		}
		for _, raw := range []string{ns, "<img", "<b onmouseover"} {
			if strings.Contains(out, raw) {
				t.Errorf("%q is not escaped:\n%s", raw, out)
			}
		}
	}
	for _, escaped := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;b onmouseover=alert", "&lt;img src=x onerror=alert(3)&gt;"} {
		if !strings.Contains(page, escaped) {
			t.Errorf("the page does not show %s", escaped)
		}
	}
	if !strings.Contains(body, `\u003cscript\u003ealert(1)\u003c/script\u003e`) {
		t.Errorf("the JSON does not carry the namespace:\n%s", body)
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// The event buffer keeps the last eventCapacity events and counts all.
func TestDebugHandlerBoundedEvents(t *testing.T) {
	db := openSQLite(t)
	srv := httptest.NewServer(DebugHandler(db))
	defer srv.Close()
	sc, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := trackedConn(t, sc).connector
	sc.Close()
	const n = 3*eventCapacity + 7
	for i := range n {
		c.events.add(eventDeadlock, fmt.Sprintf("event %d", i))
	}
	rep, _ := debugJSON(t, srv)
	ev := rep.Databases[0].Events
	if len(ev) != eventCapacity {
		t.Fatalf("%d events kept, want %d", len(ev), eventCapacity)
	}
	if ev[0].Message != fmt.Sprintf("event %d", n-eventCapacity) || ev[len(ev)-1].Message != fmt.Sprintf("event %d", n-1) {
		t.Errorf("kept %q .. %q, want the last %d", ev[0].Message, ev[len(ev)-1].Message, eventCapacity)
	}
	if got := rep.Databases[0].Counters[eventDeadlock]; got != n {
		t.Errorf("counter %d, want %d", got, n)
	}
	page := getDebug(t, srv.URL)
	if got := strings.Count(page, `<tr class="event">`); got != viewEvents || !strings.Contains(page, fmt.Sprintf("and %d older events", eventCapacity-viewEvents)) {
		t.Errorf("the page shows %d events, want the last %d and a count of the others", got, viewEvents)
	}
	if i, j := strings.Index(page, fmt.Sprintf("event %d", n-1)), strings.Index(page, fmt.Sprintf("event %d", n-2)); i < 0 || j < 0 || i > j {
		t.Error("the page does not show the newest event first")
	}
}

// Two transactions that each hold a lockset id the other waits for: the
// graph shows the cycle.
func TestDebugHandlerCycle(t *testing.T) {
	db := openSQLite(t)
	ctx := context.Background()
	srv := httptest.NewServer(DebugHandler(db))
	defer srv.Close()
	ro := &sql.TxOptions{ReadOnly: true}
	a, err := db.BeginTx(ctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback()
	b, err := db.BeginTx(ctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Rollback()
	if err := Lock(ctx, a, "acct", 1); err != nil {
		t.Fatal(err)
	}
	if err := Lock(ctx, b, "acct", 2); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	errs := make(chan error, 2)
	go func() { errs <- Lock(waitCtx, a, "acct", 2) }()
	go func() { errs <- Lock(waitCtx, b, "acct", 1) }()
	rep, _ := waitForWaiters(t, srv, 2)
	g := rep.Databases[0].Graph
	if !g.Cycle || len(g.Edges) != 2 || !g.Edges[0].InCycle || !g.Edges[1].InCycle {
		t.Errorf("graph: %+v", g)
	}
	if page := getDebug(t, srv.URL); !strings.Contains(page, `class="edge cycle"`) || !strings.Contains(page, "In-process cycle") {
		t.Error("the page does not highlight the cycle")
	}
	cancel()
	for range 2 {
		if err := <-errs; err == nil {
			t.Error("a deadlocked Lock succeeded")
		}
	}
}

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
	var w debugWaiter
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

// slowLog opens a database whose slow-wait log goes to a buffer.
func slowLogOptions(buf *syncBuffer, d time.Duration) []Option {
	return []Option{WithSlowLockLog(d), WithLogger(slog.New(slog.NewTextHandler(buf, nil)))}
}

// An in-process wait past the threshold logs once while waiting, naming
// the holder's call site, and once when it ends.
func TestSlowLockLogSQLite(t *testing.T) {
	buf := &syncBuffer{}
	db := openSQLite(t, slowLogOptions(buf, 50*time.Millisecond)...)
	ctx := context.Background()
	held, err := AcquireAdvisoryLock(ctx, db, 9) // the holder's call site
	if err != nil {
		t.Fatal(err)
	}
	var holderSite string
	c := trackedConn(t, held.Conn()).connector
	c.named.held(func(_ int64, h holderInfo, _ int) { holderSite = h.site.String() })
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(ctx, db, 9)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	waitFor(t, 10*time.Second, "the still-waiting line", func() bool { return strings.Contains(buf.String(), "still waiting") })
	log := buf.String()
	if !strings.Contains(log, "holder_site="+holderSite) || !strings.Contains(log, "kind=advisory") || !strings.Contains(log, "keys=9") ||
		!strings.Contains(holderSite, "debug_test.go:") {
		t.Errorf("the line does not name the holder's call site %s:\n%s", holderSite, log)
	}
	if strings.Contains(log, "slow lock wait: ended") {
		t.Errorf("ended before the lock was released:\n%s", log)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the ended line", func() bool { return strings.Contains(buf.String(), "slow lock wait: ended") })
	log = buf.String()
	if n := strings.Count(log, "still waiting"); n != 1 {
		t.Errorf("%d still-waiting lines, want 1:\n%s", n, log)
	}
	if n := strings.Count(log, "slow lock wait: ended"); n != 1 || !strings.Contains(log, "outcome=acquired") {
		t.Errorf("%d ended lines, want 1 with the outcome:\n%s", n, log)
	}
	// The ended line does not pass the holder's age at the still-waiting
	// line off as its age at the end.
	if _, end, _ := strings.Cut(log, "slow lock wait: ended"); !strings.Contains(end, `holder="as named `) || !strings.Contains(end, " into the wait: connection #") {
		t.Errorf("the ended line does not say when its holder was named:\n%s", end)
	}
	rep := (&debugHandler{dbs: []*sql.DB{db}, conns: []*connector{c}}).report(ctx)
	if ev := rep.Databases[0].Events; len(ev) != 1 || ev[0].Kind != eventSlowWait {
		t.Errorf("events: %+v", ev)
	}
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

// Tracking waits for the debug page and the slow-wait log allocates
// nothing per wait.
func TestWaitTrackingAllocatesNothing(t *testing.T) {
	db := openSQLite(t, WithSlowLockLog(time.Hour))
	sc, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	c := trackedConn(t, sc)
	tel := c.connector.tel
	ctx := context.Background()
	var site callsite.Stack
	site.Capture()
	wait := func() {
		_, w := tel.startWait(ctx, "lockset", "exclusive", "transaction")
		w.setWaiter(c, "", &site, "", nil)
		w.end(ctx, outcomeAcquired, nil)
	}
	wait() // starts the watcher
	with := testing.AllocsPerRun(200, wait)
	saved := tel.watch
	tel.watch = nil
	without := testing.AllocsPerRun(200, wait)
	tel.watch = saved
	if with != without {
		t.Errorf("a tracked wait allocates %v times, an untracked one %v", with, without)
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
		h[0].AdvisoryKey != fmt.Sprint(LockID("<orders>\x00"+string(intKey(17)))) || !strings.Contains(h[0].Site, "debug_test.go:") || h[0].Since.IsZero() {
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
	var row, server debugWaiter
	var rep debugReport // one report for every check below: holders and edges of one moment
	var body string
	waitFor(t, 10*time.Second, "both waiters with their blockers", func() bool {
		rep, body = debugJSON(t, srv)
		row, server = debugWaiter{}, debugWaiter{}
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
	var root holder
	for _, w := range []debugWaiter{row, server} {
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
	if !strings.Contains(root.Site, "debug_test.go:") || root.SiteKind != siteBegan || root.Since.IsZero() {
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

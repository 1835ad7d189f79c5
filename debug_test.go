package lockhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/telemetry"
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
func debugJSON(t testing.TB, srv *httptest.Server) (debugpage.Report, string) {
	t.Helper()
	body := getDebug(t, srv.URL+"?format=json")
	var rep debugpage.Report
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	return rep, body
}

// waitForWaiters polls the JSON until database 0 shows n waiters.
func waitForWaiters(t testing.TB, srv *httptest.Server, n int) (debugpage.Report, string) {
	t.Helper()
	var rep debugpage.Report
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
	want := debugpage.Edge{From: fmt.Sprintf("conn-%d", w.Conn), To: fmt.Sprintf("conn-%d", holder.id)}
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
		c.Events.Add(eventDeadlock, fmt.Sprintf("event %d", i))
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
	if got := strings.Count(page, `<tr class="event">`); got != debugpage.ViewEvents || !strings.Contains(page, fmt.Sprintf("and %d older events", eventCapacity-debugpage.ViewEvents)) {
		t.Errorf("the page shows %d events, want the last %d and a count of the others", got, debugpage.ViewEvents)
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
	c.Named.Held(func(_ int64, h inprocess.Holder, _ int) { holderSite = h.Site.String() })
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
	rep := (&debugpage.Handler{N: 1, Lookup: blockerLookupTimeout, Resolve: (&debugResolver{dbs: []*sql.DB{db}, conns: []*connector{c}}).source}).Report(ctx)
	if ev := rep.Databases[0].Events; len(ev) != 1 || ev[0].Kind != eventSlowWait {
		t.Errorf("events: %+v", ev)
	}
}

// Tracking waits for the debug page and the slow-wait log allocates
// nothing per wait beyond the wait's own record (waits.Lock), which a
// database without a watch does not make.
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
		_, w := tel.watch.Start(ctx, "lockset", "exclusive", "transaction")
		w.SetWaiter(c, "", &site, "", nil)
		w.End(ctx, telemetry.OutcomeAcquired, nil)
	}
	wait() // starts the watcher
	with := testing.AllocsPerRun(200, wait)
	saved := tel.watch
	tel.watch = nil
	without := testing.AllocsPerRun(200, wait)
	tel.watch = saved
	if with != 1 || without != 0 {
		t.Errorf("a tracked wait allocates %v times (want 1: its record), an untracked one %v (want 0)", with, without)
	}
}

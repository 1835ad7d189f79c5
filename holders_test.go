package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// nextLine returns the line after the caller's, for asserting call sites.
func nextLine(t testing.TB) string {
	t.Helper()
	_, file, line, _ := runtime.Caller(1)
	return fmt.Sprintf("%s:%d", file[strings.LastIndexByte(file, '/')+1:], line+1)
}

// replicasWithLog opens the test database twice, as two replicas of one
// service in one process: a holder and a waiter whose slow-wait log goes
// to buf, both traced by tr. With pooler, both go through PgBouncer in
// transaction mode, declared (tr's options say so).
func replicasWithLog(t *testing.T, tr *traced, buf *syncBuffer, pooler bool) (holderDB, waiterDB *sql.DB) {
	t.Helper()
	dsn := pgtest.DSN(t)
	if pooler {
		dsn = pgtest.StartPooler(t, pgtest.PoolerOptions{PoolSize: 8}).DSN(t)
	}
	holderDB = tr.openPG(t, dsn)
	var err error
	waiterDB, err = Open("pgx", dsn, append(append([]Option{}, tr.opts...), slowLogOptions(buf, 50*time.Millisecond)...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waiterDB.Close() })
	return holderDB, waiterDB
}

// A row locked by a transaction of another *sql.DB of this process (a
// second replica): the waiter's slow-wait log line, its span and the debug
// page name the holder's database, connection, pid, where its transaction
// began, its age and its trace; none shows it as an outside pid. Also
// through PgBouncer in transaction mode.
func TestHolderInAnotherDatabaseIsNamed(t *testing.T) {
	forPooler(t, testHolderInAnotherDatabaseIsNamed)
}

// forPooler runs f directly against the server and through PgBouncer in
// transaction mode (WithTransactionPooler).
func forPooler(t *testing.T, f func(t *testing.T, pooler bool, opts ...Option)) {
	t.Run("pooler=false", func(t *testing.T) { f(t, false) })
	t.Run("pooler=true", func(t *testing.T) { f(t, true, WithTransactionPooler()) })
}

func testHolderInAnotherDatabaseIsNamed(t *testing.T, pooler bool, opts ...Option) {
	tr := newTraced(opts...)
	buf := &syncBuffer{}
	a, b := replicasWithLog(t, tr, buf, pooler)
	pa, pb := connectorOf(t, a).Pool, connectorOf(t, b).Pool
	if pa == pb || pb != pa+"#2" {
		t.Errorf("two databases on one DSN have the pool names %q and %q, want distinct defaults", pa, pb)
	}
	mustExec(t, a, "CREATE TABLE jobs (id int PRIMARY KEY, state text)")
	mustExec(t, a, "INSERT INTO jobs VALUES (1, 'new')")

	ctx, parent := tr.parent("holder request")
	defer parent.End()
	began := nextLine(t)
	holderTx, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holderTx.Rollback()
	if _, err := holderTx.ExecContext(ctx, "UPDATE jobs SET state = 'running' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(DebugHandler(b))
	defer srv.Close()

	waitCtx, waitSpan := tr.parent("waiter request")
	done := make(chan error, 1)
	go func() {
		tx, err := b.BeginTx(waitCtx, nil)
		if err == nil {
			err = tx.QueryRowContext(waitCtx, "SELECT state FROM jobs WHERE id = 1 FOR UPDATE").Scan(new(string))
			tx.Rollback()
		}
		done <- err
	}()
	waitFor(t, 20*time.Second, "the still-waiting line", func() bool { return strings.Contains(buf.String(), "still waiting") })
	line := buf.String()
	t.Log(line)
	for _, want := range []string{
		fmt.Sprintf("holder_database=%s ", pa), "holder_connection=", "holder_pid=", "holder_site=" + testDir + began, "holder_age=",
		"holder_trace_id=" + parent.SpanContext().TraceID().String(), "in a transaction begun at " + testDir + began,
	} {
		if !strings.Contains(line, want) {
			t.Errorf("the slow-wait line lacks %q:\n%s", want, line)
		}
	}
	if strings.Contains(line, "blocking_pids") {
		t.Errorf("the holder is shown as an outside backend:\n%s", line)
	}

	// The page shows the holder with its database.
	var w debugpage.Waiter
	waitFor(t, 10*time.Second, "the waiter on the page", func() bool {
		rep, _ := debugJSON(t, srv)
		for _, x := range rep.Databases[0].Waiters {
			if x.Kind == "row" && len(x.Holders) > 0 {
				w = x
				return true
			}
		}
		return false
	})
	if h := w.Holders[0]; h.Database != pa || !strings.HasSuffix(h.Site, began) || h.SiteKind != holders.SiteBegan || len(w.Blockers) != 0 ||
		h.TraceID != parent.SpanContext().TraceID().String() {
		t.Errorf("the page's waiter: %+v", w)
	}

	// The wait span links to the holder's span once the blockers are read.
	waitFor(t, 10*time.Second, "the wait span's link", func() bool { return len(liveWaitSpanLinks(tr, waitSpan)) > 0 })
	holderTx.Rollback()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitSpan.End()
	spans := tr.ended("lock.wait row")
	if len(spans) != 1 {
		t.Fatalf("%d row-wait spans", len(spans))
	}
	s := spans[0]
	wantAttrs(t, s, map[attribute.Key]string{AttrHolderPool: pa, AttrHolderSite: testDir + began})
	if links := s.Links(); len(links) != 1 || links[0].SpanContext.TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("links: %+v, want one to the holder's trace", links)
	}
}

// liveWaitSpanLinks returns the links of the lock-wait spans started under
// parent that are still running (sdktrace spans are read-write).
func liveWaitSpanLinks(tr *traced, parent trace.Span) []sdktrace.Link {
	var out []sdktrace.Link
	for _, s := range tr.spans.Started() {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() && strings.HasPrefix(s.Name(), "lock.wait") {
			out = append(out, s.Links()...)
		}
	}
	return out
}

// A session advisory lock held through AcquireAdvisoryLock on another
// *sql.DB of the process: the waiter's log names where it was taken. Also
// through PgBouncer in transaction mode.
func TestAdvisoryHolderInAnotherDatabaseIsNamed(t *testing.T) {
	forPooler(t, testAdvisoryHolderInAnotherDatabaseIsNamed)
}

func testAdvisoryHolderInAnotherDatabaseIsNamed(t *testing.T, pooler bool, opts ...Option) {
	tr := newTraced(opts...)
	buf := &syncBuffer{}
	a, b := replicasWithLog(t, tr, buf, pooler)
	ctx := context.Background()
	took := nextLine(t)
	held, err := AcquireAdvisoryLock(ctx, a, 7170)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(ctx, b, 7170)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	waitFor(t, 20*time.Second, "the still-waiting line", func() bool { return strings.Contains(buf.String(), "still waiting") })
	line := buf.String()
	for _, want := range []string{"holder_database=" + connectorOf(t, a).Pool + " ", "which took it at " + testDir + took, "keys=7170"} {
		if !strings.Contains(line, want) {
			t.Errorf("the slow-wait line lacks %q:\n%s", want, line)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The process's registry holds each database from Open to Close.
func TestRegistryForgetsClosedDatabases(t *testing.T) {
	before := len(databases.List())
	db, err := Open("sqlite", t.TempDir()+"/r.db")
	if err != nil {
		t.Fatal(err)
	}
	c := connectorOf(t, db)
	found := false
	for _, x := range databases.List() {
		found = found || x == c
	}
	if !found {
		t.Error("an open database is not in the registry")
	}
	db.Close()
	for _, x := range databases.List() {
		if x == c {
			t.Error("a closed database stays in the registry")
		}
	}
	if after := len(databases.List()); after > before {
		t.Errorf("the registry grew from %d to %d", before, after)
	}
}

// Backend pids are per server: a backend that shows no identity, seen by
// a database on one server, is never named as a connection of a database
// on another server whose backend has the same pid (containers start pids
// small, so they collide); on the same server it is.
func TestBackendPIDsAreMatchedPerServer(t *testing.T) {
	db := func(name, server string) *connector {
		c := &connector{opts: &options{dialect: Postgres, logger: slog.Default()}}
		if server != "" {
			c.server.Store(&server)
		}
		c.openSide() // (nothing is opened: the test reads no server)
		databases.join(c, name)
		t.Cleanup(func() { databases.Leave(c); c.side.Close() })
		return c
	}
	open := func(c *connector, pid int32) {
		oc := &conn{connector: c, id: 1}
		oc.pin.PID.Store(pid)
		c.Opened(oc)
	}
	a := db("server-a:5432/app", "1796119200100000")
	b := db("server-b:5432/app", "1796115600700000")
	sameAsA := db("server-a:5432/reports", "1796119200100000")
	unknown := db("server-c:5432/app", "")
	open(b, 812)
	open(sameAsA, 813)
	open(unknown, 814)

	blocker := func(pid int32) holders.Blocker {
		return holders.Blocker{SeenBy: a, PID: pid, State: "idle in transaction", XactSeconds: 3, Depth: 1}
	}
	if h, ok := identify(blocker(812), nil); ok {
		t.Errorf("backend 812 of server A was named as %s, a connection of a database on server B", h)
	}
	if h, ok := identify(blocker(814), nil); ok {
		t.Errorf("backend 814 of server A was named as %s, a connection of a database whose server is not known", h)
	}
	h, ok := identify(blocker(813), nil)
	if !ok || h.Database != sameAsA.Pool || h.PID != 813 {
		t.Errorf("backend 813 of server A: %v %v, want the connection of %q on the same server", h, ok, sameAsA.Pool)
	}
}

// registryReadingHandler is a slog handler that, like a user's handler
// asking the registry for the pool names, reads lockhooks' registry while
// it handles a record.
type registryReadingHandler struct {
	slog.Handler
	logged chan string
}

func (h registryReadingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h registryReadingHandler) Handle(ctx context.Context, r slog.Record) error {
	msg := r.Message
	// A handler calling databases.List() would deadlock under the
	// registry's write lock; a list on another goroutine tells without
	// hanging the test (it returns once the lock is free, if it was not).
	listed := make(chan struct{})
	go func() { databases.List(); close(listed) }()
	select {
	case <-listed:
	case <-time.After(5 * time.Second):
		msg = "under the registry's lock: " + msg
	}
	select {
	case h.logged <- msg:
	default:
	}
	return nil
}

// The warning about two databases with one pool name is logged after the
// registry's lock is released: a logger that reads the registry (or opens
// a lockhooks database) must not deadlock Open.
func TestPoolNameClashLoggedOutsideRegistryLock(t *testing.T) {
	h := registryReadingHandler{Handler: slog.DiscardHandler, logged: make(chan string, 1)}
	logger := slog.New(h)
	opened := make(chan error, 1)
	go func() {
		var err error
		for range 2 {
			var db *sql.DB
			db, err = Open("sqlite", filepath.Join(t.TempDir(), "clash.db"), WithPoolName("clash"), WithLogger(logger))
			if err != nil {
				break
			}
			t.Cleanup(func() { db.Close() })
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Open of a second database with the same pool name did not return: the logger ran under the registry's lock")
	}
	select {
	case msg := <-h.logged:
		if !strings.HasPrefix(msg, "lockhooks: two open databases have the same pool name") {
			t.Fatalf("logged %q, want the pool-name clash warning", msg)
		}
	default:
		t.Fatal("no warning about the pool name clash")
	}
}

package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// traced is what a telemetry test reads: spans and metrics.
type traced struct {
	spans   *tracetest.SpanRecorder
	tracer  trace.Tracer
	metrics *sdkmetric.ManualReader
	opts    []Option
}

func newTraced(extra ...Option) *traced {
	tr := &traced{spans: tracetest.NewSpanRecorder(), metrics: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tr.spans))
	tr.tracer = tp.Tracer("test")
	tr.opts = append([]Option{
		WithTracerProvider(tp),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(tr.metrics))),
		WithBlockerThreshold(50 * time.Millisecond),
	}, extra...)
	return tr
}

// openPG opens dsn through lockhooks with tr's providers; closed when t ends.
func (tr *traced) openPG(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := Open("pgx", dsn, tr.opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// parent starts a recording span, as the user's request handler would.
func (tr *traced) parent(name string) (context.Context, trace.Span) {
	return tr.tracer.Start(context.Background(), name)
}

// ended returns the ended spans named name.
func (tr *traced) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		if got := attrOf(s, k).Emit(); got != v {
			t.Errorf("span %q: %s = %q, want %q", s.Name(), k, got, v)
		}
	}
}

// An advisory wait on a key another process holds: one span with the
// lock's attributes, lasting at least the wait, with an event naming the
// blocking backend and its query.
func TestAdvisoryWaitSpanNamesTheBlocker(t *testing.T) {
	tr := newTraced()
	dsn := pgtest.DSN(t)
	db := tr.openPG(t, dsn)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	holder := otherConn(t, raw)
	key := LockID("server_init")
	holderPID := pidOf(t, holder)
	mustExec(t, holder, "SELECT pg_advisory_lock($1)", key)

	ctx, parent := tr.parent("request")
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(ctx, db, key)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	waitFor(t, 10*time.Second, "the blockers event", func() bool {
		for _, s := range tr.spans.Started() {
			if s.Name() == "lock.wait advisory" && slices.ContainsFunc(s.Events(), func(e sdktrace.Event) bool { return e.Name == "lockhooks.lock.blockers" }) {
				return true
			}
		}
		return false
	})
	blockersSeen := time.Now()
	mustExec(t, holder, "SELECT pg_advisory_unlock($1)", key)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	parent.End()

	spans := tr.ended("lock.wait advisory")
	if len(spans) != 1 {
		t.Fatalf("%d advisory wait spans, want 1", len(spans))
	}
	s := spans[0]
	wantAttrs(t, s, map[attribute.Key]string{
		AttrLockKind: "advisory", AttrLockMode: "exclusive", AttrLockScope: "session",
		AttrLockKeys: "server_init (7047472480246918123)", AttrLockOutcome: "acquired", "db.system.name": "postgresql", // LockID's name

	})
	// The span covers the wait: it began before the blockers were seen and
	// ended after the holder unlocked.
	if s.StartTime().After(blockersSeen) || s.EndTime().Before(blockersSeen) || s.StartTime().Before(start) {
		t.Errorf("span ran %v..%v; the wait was seen at %v and ended after it", s.StartTime(), s.EndTime(), blockersSeen)
	}
	if d := s.EndTime().Sub(s.StartTime()); d < 50*time.Millisecond {
		t.Errorf("span lasted %v", d)
	}
	if s.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("the wait span is not a child of the caller's span")
	}
	var ev sdktrace.Event
	for _, e := range s.Events() {
		if e.Name == "lockhooks.lock.blockers" {
			ev = e
		}
	}
	var pids []int64
	var queries []string
	for _, kv := range ev.Attributes {
		switch kv.Key {
		case "lockhooks.blocker.backend_pids":
			pids = kv.Value.AsInt64Slice()
		case "lockhooks.blocker.queries":
			queries = kv.Value.AsStringSlice()
		}
	}
	if !slices.Contains(pids, int64(holderPID)) || len(queries) == 0 || !strings.Contains(queries[0], "pg_advisory_lock") {
		t.Errorf("blockers event %v does not name backend %d and its query", ev.Attributes, holderPID)
	}
}

// A lockset wait links to the holder's span; so does a writer-lock wait.
func TestInProcessWaitsLinkToTheHolder(t *testing.T) {
	tr := newTraced()
	db, _ := openSQLiteFile(t, tr.opts...)
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")

	check := func(kind string, holderSpan, waiterSpan trace.SpanContext) {
		t.Helper()
		var waits []sdktrace.ReadOnlySpan
		for _, s := range tr.ended("lock.wait " + kind) {
			if s.Parent().SpanID() == waiterSpan.SpanID() {
				waits = append(waits, s)
			}
		}
		if len(waits) != 1 {
			t.Fatalf("%d %s wait spans under the waiter's span, want 1", len(waits), kind)
		}
		s := waits[0]
		if !slices.ContainsFunc(s.Links(), func(l sdktrace.Link) bool { return l.SpanContext.SpanID() == holderSpan.SpanID() }) {
			t.Errorf("%s wait span has links %v, want one to the holder's span %v", kind, s.Links(), holderSpan.SpanID())
		}
		if site := attrOf(s, AttrHolderSite).AsString(); !strings.Contains(site, "trace_test.go") {
			t.Errorf("%s wait names the holder's call site %q", kind, site)
		}
		wantAttrs(t, s, map[attribute.Key]string{AttrLockKind: kind, AttrLockOutcome: "acquired"})
	}

	t.Run("lockset", func(t *testing.T) {
		ctxA, spanA := tr.parent("holder")
		a, err := db.BeginTx(ctxA, readOnly)
		if err != nil {
			t.Fatal(err)
		}
		if err := Lock(ctxA, a, "jobs", 7); err != nil {
			t.Fatal(err)
		}
		ctxB, spanB := tr.parent("waiter")
		b, err := db.BeginTx(ctxB, readOnly)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Rollback()
		done := make(chan error, 1)
		go func() { done <- Lock(ctxB, b, "jobs", 7) }()
		waitFor(t, 5*time.Second, "B to wait", func() bool {
			return slices.ContainsFunc(tr.spans.Started(), func(s sdktrace.ReadWriteSpan) bool { return s.Name() == "lock.wait lockset" && s.EndTime().IsZero() })
		})
		a.Commit()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		spanA.End()
		spanB.End()
		check("lockset", spanA.SpanContext(), spanB.SpanContext())
		// The holder's transaction reports how long it held its locks.
		holder := tr.ended("holder")
		if len(holder) != 1 || !slices.ContainsFunc(holder[0].Events(), func(e sdktrace.Event) bool {
			return e.Name == "lockhooks.locks.released" && slices.Contains(e.Attributes, AttrLockKind.String("lockset"))
		}) {
			t.Errorf("the holder's span has no lockhooks.locks.released event for its lockset")
		}
	})
	t.Run("writer", func(t *testing.T) {
		// Writers have waited for each other: holders record their sites.
		provokeWriterWait(t, db)
		ctxA, spanA := tr.parent("writer A")
		a, err := db.BeginTx(ctxA, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctxB, spanB := tr.parent("writer B")
		done := make(chan error, 1)
		go func() {
			b, err := db.BeginTx(ctxB, nil)
			if err == nil {
				err = b.Commit()
			}
			done <- err
		}()
		waitFor(t, 5*time.Second, "B to wait", func() bool {
			return slices.ContainsFunc(tr.spans.Started(), func(s sdktrace.ReadWriteSpan) bool { return s.Name() == "lock.wait sqlite_writer" })
		})
		a.Commit()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		spanA.End()
		spanB.End()
		check("sqlite_writer", spanA.SpanContext(), spanB.SpanContext())
	})
}

// provokeWriterWait makes a writer of db wait for another and give up, so
// that for the next minute write transactions record where they begin.
func provokeWriterWait(t *testing.T, db *sql.DB) {
	t.Helper()
	holder := beginTx(t, db, nil)
	defer holder.Rollback()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := db.BeginTx(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a writer waiting for another: %v, want context.DeadlineExceeded", err)
	}
	// The deadline may have passed while database/sql opened a connection,
	// before the writer lock was reached: only a wait in the lock counts.
	w := &connectorOf(t, db).writer
	contended := !w.core.LastWait().IsZero()
	if !contended {
		t.Fatal("the second writer never waited for the writer lock (its context ended before)")
	}
}

// A deadlock provoked step by step: outcome deadlock, status code 40P01,
// and the deadlock counter.
func TestDeadlockIsTraced(t *testing.T) {
	tr := newTraced()
	dsn := pgtest.DSN(t)
	db := tr.openPG(t, dsn)
	mustExec(t, db, "CREATE TABLE r (id int PRIMARY KEY); INSERT INTO r VALUES (1), (2)")
	mustExec(t, db, "ALTER DATABASE "+currentDatabase(t, db)+" SET deadlock_timeout = '50ms'")
	db.SetMaxIdleConns(0)
	ctx, parent := tr.parent("transfer")
	a, b := beginWithPID(t, db), beginWithPID(t, db)
	defer a.tx.Rollback()
	defer b.tx.Rollback()
	mustExec(t, a.tx, "SELECT id FROM r WHERE id = 1 FOR UPDATE")
	mustExec(t, b.tx, "SELECT id FROM r WHERE id = 2 FOR UPDATE")
	errA := make(chan error, 1)
	go func() { _, err := a.tx.ExecContext(ctx, "SELECT id FROM r WHERE id = 2 FOR UPDATE"); errA <- err }()
	waitFor(t, 10*time.Second, "A to wait", func() bool { return waiting(t, db, a.pid) })
	_, errB := b.tx.ExecContext(ctx, "SELECT id FROM r WHERE id = 1 FOR UPDATE")
	if dberr.SQLState(errB) != "40P01" {
		b.tx.Rollback()
	}
	err := errors.Join(<-errA, errB)
	if dberr.SQLState(err) != "40P01" {
		t.Fatalf("no deadlock: %v", err)
	}
	parent.End()
	var found bool
	for _, s := range tr.ended("lock.wait row") {
		if attrOf(s, AttrLockOutcome).AsString() == "deadlock" {
			found = true
			wantAttrs(t, s, map[attribute.Key]string{"db.response.status_code": "40P01", AttrLockMode: "for_no_key_update", "error.type": "deadlock"})
			if s.Status().Code != codes.Error {
				t.Error("a deadlock is not marked as an error")
			}
		}
	}
	if !found {
		t.Error("no row-lock span with outcome deadlock")
	}
	if got := counterValue(t, tr.metrics, "lockhooks.lock.deadlocks"); got != 1 {
		t.Errorf("lockhooks.lock.deadlocks = %d, want 1", got)
	}
}

// NOWAIT that finds the row locked is an outcome, not an error.
func TestNoWaitIsAnOutcome(t *testing.T) {
	tr := newTraced()
	dsn := pgtest.DSN(t)
	db := tr.openPG(t, dsn)
	mustExec(t, db, "CREATE TABLE r (id int PRIMARY KEY); INSERT INTO r VALUES (1)")
	holder := beginTx(t, db, nil)
	defer holder.Rollback()
	mustExec(t, holder, "SELECT id FROM r WHERE id = 1 FOR UPDATE")
	ctx, parent := tr.parent("worker")
	if _, err := db.ExecContext(ctx, "SELECT id FROM r WHERE id = 1 FOR UPDATE NOWAIT"); dberr.SQLState(err) != "55P03" {
		t.Fatalf("NOWAIT on a locked row: %v", err)
	}
	parent.End()
	spans := tr.ended("lock.wait row")
	if len(spans) != 1 {
		t.Fatalf("%d row spans", len(spans))
	}
	wantAttrs(t, spans[0], map[attribute.Key]string{AttrLockOutcome: "not_acquired", AttrLockNoWait: "true"})
	if spans[0].Status().Code == codes.Error {
		t.Error("NOWAIT that did not get the row is marked as an error")
	}
}

// The wait and hold histograms have points with the documented attributes.
func TestLockMetrics(t *testing.T) {
	tr := newTraced()
	db := tr.openPG(t, pgtest.DSN(t))
	mustExec(t, db, "CREATE TABLE r (id int PRIMARY KEY); INSERT INTO r VALUES (1)")
	tx := beginTx(t, db, nil)
	mustExec(t, tx, "SELECT id FROM r WHERE id = 1 FOR UPDATE")
	if err := Lock(context.Background(), tx, "jobs", 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	l, err := AcquireAdvisoryLock(context.Background(), db, 99)
	if err != nil {
		t.Fatal(err)
	}
	l.Release(context.Background())

	points := func(name string) []metricdata.HistogramDataPoint[float64] {
		m, ok := collect(t, tr.metrics, name)
		if !ok {
			t.Fatalf("no metric %s", name)
		}
		return m.Data.(metricdata.Histogram[float64]).DataPoints
	}
	has := func(dps []metricdata.HistogramDataPoint[float64], want ...attribute.KeyValue) bool {
		for _, dp := range dps {
			ok := true
			for _, kv := range want {
				if v, found := dp.Attributes.Value(kv.Key); !found || v != kv.Value {
					ok = false
				}
			}
			if ok && dp.Count > 0 {
				return true
			}
		}
		return false
	}
	waits := points("lockhooks.lock.wait.duration")
	for _, kind := range []string{"row", "lockset", "advisory"} {
		if !has(waits, AttrLockKind.String(kind), AttrLockOutcome.String("acquired"), telemetry.AttrDBSystem.String("postgresql")) {
			t.Errorf("no wait point for kind %s: %v", kind, waits)
		}
	}
	holds := points("lockhooks.lock.hold.duration")
	for _, want := range [][]attribute.KeyValue{
		{AttrLockKind.String("row"), AttrLockScope.String("transaction")},
		{AttrLockKind.String("lockset"), AttrLockScope.String("transaction")},
		{AttrLockKind.String("advisory"), AttrLockScope.String("session")},
	} {
		if !has(holds, want...) {
			t.Errorf("no hold point %v", want)
		}
	}
}

// Quiet by default: no span without a recording parent; WithRootSpans
// opts in; WithStatementSpans adds a client span per statement.
func TestSpansNeedAParentByDefault(t *testing.T) {
	dsn := pgtest.DSN(t)
	for _, c := range []struct {
		name  string
		opts  []Option
		spans int
	}{
		{"default", nil, 0},
		{"root spans", []Option{WithRootSpans(true)}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newTraced(c.opts...)
			db := tr.openPG(t, dsn)
			mustExec(t, db, "SELECT 1 FOR UPDATE")
			if n := len(tr.spans.Ended()); n != c.spans {
				t.Errorf("%d spans, want %d", n, c.spans)
			}
		})
	}
	t.Run("statement spans", func(t *testing.T) {
		tr := newTraced(WithStatementSpans(true))
		db := tr.openPG(t, dsn)
		mustExec(t, db, "CREATE TABLE IF NOT EXISTS users (id int)")
		ctx, parent := tr.parent("handler")
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM users WHERE id = $1", 1).Scan(&n); err != nil {
			t.Fatal(err)
		}
		parent.End()
		spans := tr.ended("SELECT users")
		if len(spans) != 1 {
			t.Fatalf("statement spans: %v", tr.spans.Ended())
		}
		wantAttrs(t, spans[0], map[attribute.Key]string{"db.query.text": "SELECT count(*) FROM users WHERE id = $1", "db.system.name": "postgresql"})
		if spans[0].SpanKind() != trace.SpanKindClient {
			t.Error("a statement span is not a client span")
		}
	})
}

// A statement that takes no lock costs the wrapper no allocation, with the
// default (no-op) providers.
func TestNoAllocationsOnPlainStatements(t *testing.T) {
	for _, d := range []Dialect{Postgres, SQLite} {
		fc := newFakeConn()
		fc.quiet = true
		fc.rows = func() driver.Rows { return (*fakeRows)(nil) }
		w := newConn(newConnector(fakeConnector{}, &Driver{}, mustOptions(t, WithDialect(d)), "", sqlitelock.DSN{}), fc)
		ctx := context.Background()
		exec := w.(driver.ExecerContext)
		query := w.(driver.QueryerContext)
		for _, q := range []string{"UPDATE t SET v = v + 1 WHERE id = $1", "SELECT v FROM t WHERE id = $1"} {
			if n := testing.AllocsPerRun(200, func() { exec.ExecContext(ctx, q, nil) }); n != 0 {
				t.Errorf("%s: ExecContext(%q): %v allocations", d, q, n)
			}
			if strings.HasPrefix(q, "UPDATE") {
				continue // a query that writes holds SQLite's writer lock until its rows close
			}
			if n := testing.AllocsPerRun(200, func() {
				if rows, err := query.QueryContext(ctx, q, nil); err == nil {
					rows.Close()
				}
			}); n != 0 {
				t.Errorf("%s: QueryContext(%q): %v allocations", d, q, n)
			}
		}
	}
}

// With only WithTracerProvider (no parent span, no WithRootSpans), a wait
// that lasted 100ms or more is recorded as a trace of its own, from the
// moment it began, with its holder; a short acquisition is not.
func TestLongWaitsWithoutAParentGetASpan(t *testing.T) {
	tr := newTraced()
	db, _ := openSQLiteFile(t, tr.opts...)
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	ctx := context.Background()
	began := nextLine(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, cancel := context.WithCancel(ctx) // another call chain: it waits
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := db.ExecContext(other, "INSERT INTO t VALUES (1)")
		done <- err
	}()
	w := &connectorOf(t, db).writer
	waitFor(t, 10*time.Second, "the waiter", func() bool {
		return w.core.Waiting() == 1
	})
	for time.Since(start) < 2*telemetry.OrphanWait { // the wait must last; its outcome does not depend on it
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, "INSERT INTO t VALUES (2)") // uncontended: no span
	spans := tr.ended("lock.wait sqlite_writer")
	if len(spans) != 1 {
		t.Fatalf("%d writer-wait spans, want 1: %v", len(spans), tr.spans.Ended())
	}
	s := spans[0]
	if s.Parent().IsValid() || s.EndTime().Sub(s.StartTime()) < telemetry.OrphanWait || s.StartTime().Before(start) {
		t.Errorf("span from %v to %v (wait began %v), parent %v", s.StartTime(), s.EndTime(), start, s.Parent())
	}
	wantAttrs(t, s, map[attribute.Key]string{AttrLockOutcome: "acquired", AttrHolderSite: testDir + began})
}

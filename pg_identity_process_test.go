package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// Two OS processes: the parent test is one replica, a child process (this
// test binary again, in a helper mode chosen by an environment variable)
// the other. The child holds a lock and reports where; the parent waits for
// it, and its slow-wait line, error and span must name the child's process,
// backend pid, Go file:line and how long it has held.

// envIdentityChildMode names the incident the child stages; its database
// comes from childDBEnv.
const envIdentityChildMode = "LOCKHOOKS_IDENTITY_CHILD"

// childReport is what the child prints: "child: <what> k=v …".
type childReport map[string]string

// identityChild is a TestIdentityChildProcess process, and its process
// label as identities name it.
type identityChild struct {
	*testChild
	label string
}

// startIdentityChild runs the child in mode against dsn and returns once
// it reported ready; the test fails if it does not exit cleanly when the
// test ends.
func startIdentityChild(t *testing.T, mode, dsn string, pooler bool) (*identityChild, childReport) {
	t.Helper()
	env := append(childDBEnv(dsn, pooler), envIdentityChildMode+"="+mode)
	ch := &identityChild{testChild: startTestChild(t, "TestIdentityChildProcess", env...)}
	t.Cleanup(func() { // registered after the child's own, so run before it: the exit status is checked here
		ch.stdin.Close()
		select {
		case <-ch.proc.Exited():
			if err := ch.proc.Err(); err != nil {
				t.Errorf("child %s: %v\n%s", mode, err, ch.stderr.String())
			}
		case <-time.After(30 * time.Second):
		}
	})
	ready := ch.next(t, "ready")
	ch.label = ready["label"]
	if !strings.Contains(ch.label, "/"+strconv.Itoa(ch.cmd.Process.Pid)+":") {
		t.Fatalf("the child's process label %q does not name its pid %d", ch.label, ch.cmd.Process.Pid)
	}
	return ch, ready
}

// next waits for the child's report what ("child: <what> k=v …"; other
// lines of its output are passed over).
func (ch *identityChild) next(t *testing.T, what string) childReport {
	t.Helper()
	for {
		line, ok := strings.CutPrefix(ch.line(t, fmt.Sprintf("%q", what), 60*time.Second), "child: ")
		if !ok {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != what {
			t.Fatalf("the child said %q, want %q", line, what)
		}
		r := childReport{}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			r[k] = v
		}
		return r
	}
}

// TestIdentityChildProcess is the child's side; it runs only in a child
// process started by the tests below.
func TestIdentityChildProcess(t *testing.T) {
	mode := os.Getenv(envIdentityChildMode)
	if mode == "" {
		t.Skip("the child side of the two-process identity tests; they run it in a process of its own")
	}
	db, err := openChildDB()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	ctx, span := tp.Tracer("child").Start(context.Background(), "child job")
	defer span.End()
	say := func(what string, kv ...any) {
		s := "child: " + what
		for i := 0; i+1 < len(kv); i += 2 {
			s += fmt.Sprintf(" %v=%v", kv[i], kv[i+1])
		}
		fmt.Println(s)
	}
	stdinClosed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	switch mode {
	case "leak":
		// A session lock taken on the pool and never released: the
		// connection goes back to the pool, and lockhooks parks it.
		site := here(1)
		if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock($1)", identityKey); err != nil {
			t.Fatal(err)
		}
		say("ready", "label", identity.ProcessLabel(), "site", site, "trace", span.SpanContext().TraceID(), "since", time.Now().UnixMilli())
		<-stdinClosed
	case "rows":
		// A transaction holds a row lock; another one of this process waits
		// for it, queued ahead of whoever comes next.
		site := here(1)
		holder, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := holder.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		queuedSite := here(1)
		queued, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		say("ready", "label", identity.ProcessLabel(), "site", site, "queued_site", queuedSite, "since", time.Now().UnixMilli())
		done := make(chan error, 1)
		go func() {
			_, err := queued.ExecContext(ctx, "UPDATE t SET v = v + 10 WHERE id = 1")
			done <- err
		}()
		<-stdinClosed
		holder.Rollback()
		if err := <-done; err != nil {
			t.Errorf("the queued UPDATE: %v", err)
		}
		queued.Rollback()
	default:
		t.Fatalf("unknown child mode %q", mode)
	}
}

// identityKey is the advisory key of the two-process tests.
const identityKey = 730_031

// twoProcessDSN is the database both processes use: direct, or through a
// PgBouncer in transaction mode of the test's own.
func twoProcessDSN(t *testing.T, pooler bool) string {
	if pooler {
		return pgtest.StartPooler(t, pgtest.PoolerOptions{PoolSize: 8}).DSN(t)
	}
	return pgtest.DSN(t)
}

// parentDB opens the parent's side: a slow-wait log into buf, spans into
// tr, blockers looked up soon.
func parentDB(t *testing.T, dsn string, pooler bool, buf *syncBuffer) (*sql.DB, *traced) {
	opts := []Option{WithSlowLockLog(300 * time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(buf, nil)))}
	if pooler {
		opts = append(opts, WithTransactionPooler())
	}
	tr := newTraced(opts...)
	return tr.openPG(t, dsn), tr
}

// cancelOnceNamed cancels the parent's wait once its slow-wait line is out
// and its span (still open) names the holder: the wait's error then names
// it too. The wait's own minute-long timeout is only a safety net.
func cancelOnceNamed(tr *traced, buf *syncBuffer, span string, cancel func()) {
	defer cancel()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if strings.Contains(buf.String(), "slow lock wait: still waiting") {
			for _, s := range tr.spans.Started() {
				if s.Name() != span {
					continue
				}
				for _, kv := range s.Attributes() {
					if kv.Key == AttrHolderProcess {
						return
					}
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logLine returns the slow-wait line that says msg.
func logLine(t *testing.T, buf *syncBuffer, msg string) string {
	t.Helper()
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.Contains(line, msg) {
			return line
		}
	}
	t.Fatalf("no %q in the log:\n%s", msg, buf.String())
	return ""
}

// logAge reads a duration attribute of a log line.
func logAge(t *testing.T, line, key string) time.Duration {
	t.Helper()
	s := logAttr(t, line, key)
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s=%s: %v", key, s, err)
	}
	return d
}

// waitSpan returns the ended span named name, with its holder attributes.
func waitSpan(t *testing.T, tr *traced, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := tr.ended(name)
	if len(spans) != 1 {
		t.Fatalf("%d %q spans, want 1", len(spans), name)
	}
	return spans[0]
}

// shortSite is file:line of site, which application_name keeps when the
// whole site does not fit.
func shortSite(site string) string {
	if i := strings.LastIndexByte(site, '/'); i >= 0 {
		return site[i+1:]
	}
	return site
}

// siteMatches reports whether got names site, whole or as application_name
// shortens it (without its directory, or "~" and its end).
func siteMatches(got, site string) bool {
	if tail, ok := strings.CutPrefix(got, "~"); ok {
		return strings.HasSuffix(site, tail)
	}
	return got == site || strings.HasSuffix(site, "/"+got)
}

// logAttr reads an attribute of a log line.
func logAttr(t *testing.T, line, key string) string {
	t.Helper()
	m := regexp.MustCompile(` ` + key + `=(\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no %s in %s", key, line)
	}
	return m[1]
}

// wantSite checks that a log attribute or span attribute names site.
func wantSite(t *testing.T, what, got, site string) {
	t.Helper()
	if !siteMatches(got, site) {
		t.Errorf("%s names site %q, want %s", what, got, site)
	}
}

// wantContains checks that s says each of want.
func wantContains(t *testing.T, what, s string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, s)
		}
	}
}

// A session lock leaked in another process (taken on the pool and never
// released, so the other process's lockhooks parks its connection): a
// waiter here (cancelled once it has looked) is told the other process, its backend, the Go line that took
// the lock and how long ago, and its span links to the trace that took it.
func TestIdentityLeakedLockInAnotherProcess(t *testing.T) {
	for _, pooler := range []bool{false, true} {
		t.Run("pooler="+strconv.FormatBool(pooler), func(t *testing.T) {
			dsn := twoProcessDSN(t, pooler)
			ch, ready := startIdentityChild(t, "leak", dsn, pooler)
			raw := openRaw(t, pgtest.DSN(t)) // any database of the server sees pg_locks
			hpid := holderPID(t, raw, identityKey)
			buf := &syncBuffer{}
			db, tr := parentDB(t, dsn, pooler, buf)
			ctx, parent := tr.parent("replica B")
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			go cancelOnceNamed(tr, buf, "lock.wait advisory", cancel)
			start := time.Now()
			_, err := AcquireAdvisoryLock(wctx, db, identityKey)
			cancel()
			parent.End()
			if err == nil {
				t.Fatal("AcquireAdvisoryLock took a lock the child holds")
			}
			since, _ := strconv.ParseInt(ready["since"], 10, 64)
			maxAge := time.Since(time.UnixMilli(since)) + time.Second
			site, who, pidText := ready["site"], "process "+ch.label, fmt.Sprintf("backend pid %d", hpid)

			line := logLine(t, buf, "slow lock wait: still waiting")
			wantContains(t, "the slow-wait line", line, "holder_process="+ch.label, shortSite(site),
				fmt.Sprintf("holder_pid=%d", hpid), "keys="+strconv.Itoa(identityKey), who, pidText)
			wantSite(t, "the slow-wait line", logAttr(t, line, "holder_site"), site)
			if age := logAge(t, line, "holder_age"); age <= 0 || age > maxAge {
				t.Errorf("holder_age=%v, want (0, %v]", age, maxAge)
			}
			wantContains(t, "the error", err.Error(), who, shortSite(site), pidText, "for ")

			s := waitSpan(t, tr, "lock.wait advisory")
			wantAttrs(t, s, map[attribute.Key]string{
				AttrHolderProcess: ch.label, AttrHolderPID: strconv.Itoa(int(hpid)),
				AttrLockKeys: strconv.Itoa(identityKey), AttrLockOutcome: telemetry.OutcomeCanceled,
			})
			wantSite(t, "the span", attrOf(s, AttrHolderSite).AsString(), site)
			if held := attrOf(s, AttrHolderHeldSeconds).AsFloat64(); held <= 0 || held > maxAge.Seconds() {
				t.Errorf("span: held_seconds %v", held)
			}
			linked := false
			for _, l := range s.Links() {
				linked = linked || l.SpanContext.TraceID().String() == ready["trace"]
			}
			if !linked {
				t.Errorf("the wait span has no link to the child's trace %s: %+v", ready["trace"], s.Links())
			}
			t.Logf("waited %v; error: %v\nlog: %s", time.Since(start).Round(time.Millisecond), err, line)
		})
	}
}

// A transaction in another process holds a row lock, and a transaction
// there waits for it: a waiter here is told the holder at the root (the
// other process, its backend, the Go line where its transaction began, how
// long it has been open), not the one queued between, which it names as
// queued.
func TestIdentityRowLockChainInAnotherProcess(t *testing.T) {
	for _, pooler := range []bool{false, true} {
		t.Run("pooler="+strconv.FormatBool(pooler), func(t *testing.T) {
			dsn := twoProcessDSN(t, pooler)
			mustExec(t, openRaw(t, dsn), "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)")
			ch, ready := startIdentityChild(t, "rows", dsn, pooler)
			raw := openRaw(t, pgtest.DSN(t))
			var holder, queued int32
			waitFor(t, 30*time.Second, "the child's second transaction to wait", func() bool {
				err := raw.QueryRow(`SELECT w.pid, (pg_blocking_pids(w.pid))[1] FROM pg_stat_activity w
					WHERE w.wait_event_type = 'Lock' AND w.query LIKE 'UPDATE t SET v = v + 10%'`).Scan(&queued, &holder)
				return err == nil
			})
			buf := &syncBuffer{}
			db, tr := parentDB(t, dsn, pooler, buf)
			ctx, parent := tr.parent("replica B")
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			go cancelOnceNamed(tr, buf, "lock.wait row", cancel)
			tx, err := db.BeginTx(wctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var v int
			err = tx.QueryRowContext(wctx, "SELECT v FROM t WHERE id = 1 FOR UPDATE").Scan(&v)
			tx.Rollback()
			cancel()
			parent.End()
			if err == nil {
				t.Fatal("FOR UPDATE locked the row the child holds")
			}
			since, _ := strconv.ParseInt(ready["since"], 10, 64)
			maxAge := time.Since(time.UnixMilli(since)) + 2*time.Second
			// A transaction's identity is in application_name alone, whose 63
			// bytes may keep only file:line of a site in a long directory.
			site, who := ready["site"], "process "+ch.label
			holderText, queuedText := fmt.Sprintf("backend pid %d", holder), fmt.Sprintf("backend pid %d", queued)

			line := logLine(t, buf, "slow lock wait: still waiting")
			wantContains(t, "the slow-wait line", line, "holder_process="+ch.label,
				fmt.Sprintf("holder_pid=%d", holder), fmt.Sprintf("queued_pids=%d", queued), who, holderText,
				"in a transaction begun at ", shortSite(site), "queued ahead of this wait", queuedText, shortSite(ready["queued_site"]))
			wantSite(t, "the slow-wait line", logAttr(t, line, "holder_site"), site)
			if age := logAge(t, line, "holder_age"); age <= 0 || age > maxAge {
				t.Errorf("holder_age=%v, want (0, %v]", age, maxAge)
			}
			// The root holder is named before the queued one.
			if strings.Index(line, holderText) > strings.Index(line, queuedText) {
				t.Errorf("the queued backend is named before the holder: %s", line)
			}
			wantContains(t, "the error", err.Error(), who, shortSite(site), holderText, "queued ahead", queuedText)

			s := waitSpan(t, tr, "lock.wait row")
			wantAttrs(t, s, map[attribute.Key]string{
				AttrHolderProcess: ch.label, AttrHolderPID: strconv.Itoa(int(holder)),
			})
			wantSite(t, "the span", attrOf(s, AttrHolderSite).AsString(), site)
			if held := attrOf(s, AttrHolderHeldSeconds).AsFloat64(); held <= 0 || held > maxAge.Seconds() {
				t.Errorf("span: held_seconds %v", held)
			}
			t.Logf("error: %v\nlog: %s", err, line)
		})
	}
}

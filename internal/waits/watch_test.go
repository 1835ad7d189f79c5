package waits

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// conn stands for the caller's waiting connection.
type conn struct{ id int }

func (c *conn) AppendWaitArgs(args []any) []any { return append(args, "connection", c.id) }
func (c *conn) PID() int32                      { return 0 }

// wait is the caller's record of a wait, holding its Entry by value.
type wait struct{ Entry[*conn, int] }

// lines is a slog handler that hands each record's message and
// attributes to a channel.
type lines struct{ out chan map[string]string }

func (l lines) Enabled(context.Context, slog.Level) bool { return true }
func (l lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l lines) WithGroup(string) slog.Handler            { return l }
func (l lines) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.out <- m
	return nil
}

// next returns the next line logged, or fails the test after a bound.
func (l lines) next(t *testing.T) map[string]string {
	t.Helper()
	select {
	case m := <-l.out:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no slow-wait line within 10s")
		return nil
	}
}

// start begins w's telemetry.Wait (a Set without providers records
// nothing) and lists it.
func start(ctx context.Context, ww *Watch[*conn, int], w *wait, kind string, attrs ...attribute.KeyValue) {
	set := telemetry.New(telemetry.Config{System: "sqlite", Pool: "test"})
	set.StartWait(ctx, &w.Wait, kind, "exclusive", "session", attrs...)
	ww.Add(ctx, &w.Entry, attrs)
}

func TestListOldestFirst(t *testing.T) {
	ww := New(Config[*conn, int]{})
	defer ww.Close()
	ctx := context.Background()
	var a, b, c wait
	start(ctx, ww, &a, "advisory", telemetry.AttrLockKeys.String("7"))
	start(ctx, ww, &b, "lockset", telemetry.AttrLockNamespace.String("invoices"), telemetry.AttrLockKeys.String("1, 2"))
	start(ctx, ww, &c, "row")
	ww.SetWaiter(&b.Entry, &conn{id: 2}, "app.go:12", nil, "", []int{1, 2})
	if got := kinds(ww.List()); got != "advisory lockset row" {
		t.Fatalf("listed %q, want the waits oldest first", got)
	}
	ww.Remove(&b.Entry, telemetry.OutcomeAcquired)
	ww.Remove(&b.Entry, telemetry.OutcomeAcquired) // a second removal changes nothing
	views, total := ww.ListBounded(1, nil)
	if total != 2 || kinds(views) != "advisory" {
		t.Fatalf("bounded to 1: %q of %d, want advisory of 2", kinds(views), total)
	}
	if b.Keys() != "1, 2" || b.Namespace() != "invoices" || b.Waiter().id != 2 || len(b.AdvisoryKeys()) != 2 {
		t.Errorf("the entry kept keys %q, namespace %q, waiter %v, keys %v", b.Keys(), b.Namespace(), b.Waiter(), b.AdvisoryKeys())
	}
	if started, _ := ww.Counts(); started != 3 {
		t.Errorf("%d waits counted as started, want 3", started)
	}
	var n int
	ww.ListBounded(0, func(keys []int) { n += len(keys) })
	if n != 0 {
		t.Errorf("the advisory keys of the listed waits: %d, want 0 (b is no longer listed)", n)
	}
}

func kinds(vs []View[*conn, int]) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Kind)
	}
	return strings.Join(out, " ")
}

// A wait past the threshold is logged once while it waits, naming the
// holder the caller found, and once as it ends, repeating that holder.
func TestSlowWaitIsLoggedWhileWaitingAndAtItsEnd(t *testing.T) {
	log := lines{out: make(chan map[string]string, 4)}
	events := holders.NewEvents(8)
	holder := holders.Holder{Database: "orders", Conn: 3, Site: "jobs.go:40"}
	ww := New(Config[*conn, int]{Threshold: 20 * time.Millisecond, Logger: slog.New(log), Events: events,
		HoldersOf: func(context.Context, View[*conn, int]) *holders.Blockage {
			return &holders.Blockage{Holders: []holders.Holder{holder}, At: time.Now()}
		}})
	defer ww.Close()
	var w wait
	// (said of the entry before it is listed, so that the watcher sees it
	// whenever it reports)
	ww.SetWaiter(&w.Entry, &conn{id: 9}, "app.go:7", nil, "", nil)
	ww.SetSelfHint(&w.Entry, "its own transaction holds it")
	start(context.Background(), ww, &w, "advisory", telemetry.AttrLockKeys.String("42"))

	still := log.next(t)
	if still["msg"] != "lockhooks: slow lock wait: still waiting" || still["keys"] != "42" || still["connection"] != "9" ||
		still["waiting_at"] != "app.go:7" || still["self_wait"] != "its own transaction holds it" {
		t.Fatalf("the still-waiting line: %v", still)
	}
	ww.Remove(&w.Entry, telemetry.OutcomeTimeout)
	end := log.next(t)
	if end["msg"] != "lockhooks: slow lock wait: ended" || end["outcome"] != telemetry.OutcomeTimeout ||
		!strings.Contains(end["holder"], `connection #3 of "orders"`) || !strings.HasPrefix(end["holder"], "as named ") {
		t.Fatalf("the last line: %v", end)
	}
	// (the last line is written once the holder is noted on the entry)
	if named := ww.HolderNamed(&w.Entry); !strings.Contains(named, `connection #3 of "orders"`) {
		t.Errorf("the holder named for the wait's error: %q, want the holder found", named)
	}
	evs, _ := events.Snapshot()
	if len(evs) != 1 || evs[0].Kind != EventSlowWait || !strings.Contains(evs[0].Message, "advisory lock 42 waited more than 20ms") {
		t.Errorf("events: %+v, want one slow wait", evs)
	}
}

// A wait with a deadline looks up its holder shortly before it, without a
// slow-wait threshold.
func TestLookupBeforeTheDeadline(t *testing.T) {
	asked := make(chan struct{})
	ww := New(Config[*conn, int]{LookUpBeforeDeadline: true, Logger: slog.New(lines{out: make(chan map[string]string, 1)}),
		HoldersOf: func(ctx context.Context, v View[*conn, int]) *holders.Blockage {
			defer close(asked)
			return &holders.Blockage{Holders: []holders.Holder{{Conn: 5}}, At: time.Now()}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var w wait
	start(ctx, ww, &w, "advisory")
	<-asked
	ww.Close() // waits for the watcher, so the lookup's result is noted
	if named := ww.HolderNamed(&w.Entry); !strings.Contains(named, "connection #5") {
		t.Errorf("looked up before the deadline: %q", named)
	}
	var later wait
	start(context.Background(), ww, &later, "advisory")
	if len(ww.List()) != 1 {
		t.Errorf("%d waits listed after Close, want the one listed before it", len(ww.List()))
	}
}

// Close does not wait out a lookup on a server that stopped answering: it
// cancels the lookup's context.
func TestCloseCancelsAHangingLookup(t *testing.T) {
	hanging := make(chan struct{})
	var once sync.Once
	ww := New(Config[*conn, int]{LookUpBeforeDeadline: true, Logger: slog.New(lines{out: make(chan map[string]string, 1)}),
		HoldersOf: func(ctx context.Context, v View[*conn, int]) *holders.Blockage {
			once.Do(func() { close(hanging) })
			<-ctx.Done() // a server that stopped answering
			return &holders.Blockage{Err: ctx.Err()}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	var w wait
	start(ctx, ww, &w, "advisory")
	runtime.Gosched() // (let the watcher go to sleep until the first wait's lookup, an hour away)
	// A second wait whose deadline is near is looked up first: the
	// watcher wakes for it (it did not, once: a wait added while the
	// watcher slept until a later one was due was looked up only then).
	soon, cancelSoon := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelSoon()
	var h wait
	start(soon, ww, &h, "advisory")
	select {
	case <-hanging:
	case <-time.After(10 * time.Second):
		t.Fatal("the wait with the nearer deadline was not looked up within 10s (its lookup was due after 75ms)")
	}
	closed := make(chan struct{})
	go func() { ww.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(LookupTimeout / 2):
		t.Fatalf("Close still waits for a hanging lookup after %v (a lookup's own bound is %v)", LookupTimeout/2, LookupTimeout)
	}
}

// A nil Watch tracks nothing, and the hint still reaches the entry.
func TestNilWatch(t *testing.T) {
	var ww *Watch[*conn, int]
	var w wait
	ww.Add(context.Background(), &w.Entry, nil)
	ww.SetWaiter(&w.Entry, &conn{}, "x", nil, "", nil)
	ww.SetSelfHint(&w.Entry, "hint")
	ww.NoteFound(&w.Entry, &holders.Blockage{Holders: []holders.Holder{{}}})
	ww.Remove(&w.Entry, "")
	if ww.SelfHint(&w.Entry) != "hint" || ww.HolderNamed(&w.Entry) != "" || ww.List() != nil || w.Waiter() != nil {
		t.Error("a nil Watch kept state")
	}
}

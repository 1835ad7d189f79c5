package waits

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/telemetry"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

var (
	errSelf = errors.New("self-wait")
	errLost = errors.New("lost")
)

// probe is the caller's probe beside a wait.
type probe struct{ stopped bool }

func (p *probe) Stop() bool { p.stopped = true; return true }

// A lock wait is one allocation of Lock; the runtime adds an 8-byte
// header to objects over 512 bytes that hold pointers, and rounds up to a
// size class. The record fit the 576-byte class before internal/telemetry
// (568 bytes): a field more must be paid for somewhere else.
func TestLockFitsItsSizeClass(t *testing.T) {
	if size := unsafe.Sizeof(Lock[*conn, int]{}); size+8 > 576 {
		t.Errorf("Lock is %d bytes: with its allocation header it no longer fits the 576-byte size class", size)
	}
}

// A nil Watch starts no wait, and every method of a nil Lock is safe.
func TestNilLock(t *testing.T) {
	var ww *Watch[*conn, int]
	ctx, w := ww.Start(context.Background(), "advisory", "exclusive", "session")
	if w != nil || ctx == nil {
		t.Fatal("a nil Watch starts no wait")
	}
	w.SetWaiter(&conn{id: 1}, "app.go:1", nil, "", nil)
	w.NoteSelfHint("likely")
	w.SetProbe(&probe{})
	w.HeldBy(holders.Holder{Conn: 2})
	w.NoteFound(&holders.Blockage{})
	w.LookForBlockers(7, time.Second)
	if w.Recording() || w.WantsHolder() || w.HolderNamed() != "" || w.TakeProbe() != nil {
		t.Error("a nil Lock reports nothing")
	}
	err := context.DeadlineExceeded
	if got := w.WithSelfHint(err); got != err {
		t.Errorf("a nil Lock leaves errors alone: %v", got)
	}
	w.End(ctx, "", err)
}

// A wait is listed from Start to End, with the outcome derived from its
// error where none is given; its self-wait hint is added to the error of
// a wait that timed out or was cancelled, never to a certain self-wait's
// or another failure's; its probe is the caller's to take back once.
func TestLockStartToEnd(t *testing.T) {
	set := telemetry.New(telemetry.Config{System: "postgresql", Pool: "test"})
	ww := New(Config[*conn, int]{Telemetry: set, SelfWait: errSelf})
	defer ww.Close()
	ctx, w := ww.Start(context.Background(), "advisory", "exclusive", "session", telemetry.AttrLockKeys.String("7"))
	w.SetWaiter(&conn{id: 3}, "app.go:9", nil, "", []int{7})
	if got := ww.List(); len(got) != 1 || got[0].Keys != "7" || got[0].Waiter.id != 3 || got[0].Site != "app.go:9" {
		t.Fatalf("listed: %+v", got)
	}
	timeout := fmt.Errorf("waiting: %w", context.DeadlineExceeded)
	if got := w.WithSelfHint(timeout); got != timeout {
		t.Errorf("no hint yet: %v", got)
	}
	w.NoteSelfHint("likely a self-wait")
	if got := w.WithSelfHint(timeout); !errors.Is(got, context.DeadlineExceeded) || got.Error() != "waiting: context deadline exceeded (likely a self-wait)" {
		t.Errorf("a timeout gets the hint: %v", got)
	}
	self := fmt.Errorf("refused: %w", errSelf)
	if got := w.WithSelfHint(self); got != self {
		t.Errorf("a certain self-wait gets no hint: %v", got)
	}
	if other := errors.New("syntax error"); w.WithSelfHint(other) != other {
		t.Error("another failure gets no hint")
	}
	p := &probe{}
	w.SetProbe(p)
	if w.TakeProbe() != p || w.TakeProbe() != nil {
		t.Error("the probe is taken back once")
	}
	w.End(ctx, "", timeout)
	if got := ww.List(); len(got) != 0 {
		t.Errorf("still listed after End: %+v", got)
	}
	if started, _ := ww.Counts(); started != 1 {
		t.Errorf("started %d waits", started)
	}
}

// traced returns a database's telemetry whose spans rec records, with the
// blocker threshold given.
func traced(t *testing.T, threshold time.Duration) (*telemetry.Set, *sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	set := telemetry.New(telemetry.Config{TracerProvider: tp, BlockerThreshold: threshold, System: "postgresql", Pool: "test"})
	t.Cleanup(set.Close)
	return set, tp, rec
}

// A recorded wait that lasts the blocker threshold asks HoldersOf, from a
// goroutine of its own, with the wait as the waiting goroutine set it; the
// holders found at depth become the span's, the server's backends its
// event, and the finding the wait's (for its timeout error and orphan
// span). End derives the outcome from the error by the Config's Outcomes.
func TestLockLooksForBlockers(t *testing.T) {
	set, tp, rec := traced(t, time.Millisecond)
	asked := make(chan View[*conn, int], 1)
	ww := New(Config[*conn, int]{Telemetry: set, Outcomes: telemetry.Outcomes{Lost: errLost},
		HoldersOf: func(ctx context.Context, v View[*conn, int]) *holders.Blockage {
			asked <- v
			return &holders.Blockage{At: time.Now(), Holders: []holders.Holder{
				{Database: "orders", Conn: 2, PID: 102, Depth: 1},
				{Database: "orders", Conn: 3, PID: 103, Depth: 1, Queued: true},
			}}
		}})
	defer ww.Close()

	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	ctx, w := ww.Start(ctx, "advisory", "exclusive", "session", telemetry.AttrLockKeys.String("7"))
	waiter := &conn{id: 1}
	w.SetWaiter(waiter, "app.go:3", nil, "", []int{7})
	w.LookForBlockers(101, 10*time.Second)
	select {
	case v := <-asked:
		if v.Waiter != waiter || v.Kind != "advisory" || len(v.AdvKeys) != 1 || v.AdvKeys[0] != 7 || v.Entry != &w.Entry {
			t.Errorf("HoldersOf was asked about %+v", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the lookup never ran")
	}
	deadline := time.Now().Add(10 * time.Second)
	for ww.Found(&w.Entry) == nil { // noted after HoldersOf returns, on the lookup's goroutine
		if time.Now().After(deadline) {
			t.Fatal("the lookup's finding was never noted")
		}
		time.Sleep(time.Millisecond)
	}
	w.End(ctx, "", fmt.Errorf("waiting: %w", errLost))
	parent.End()

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("ended spans %v, want the wait's and the request's", spans)
	}
	attrs := map[string]string{}
	for _, a := range spans[0].Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs[string(telemetry.AttrLockOutcome)] != telemetry.OutcomeLost || attrs[string(telemetry.AttrHolderConn)] != "2" {
		t.Errorf("span attributes %v: want outcome lost and the holder at depth, not the queued one", attrs)
	}
	events := spans[0].Events()
	if len(events) != 2 || events[0].Name != "lockhooks.lock.blockers" || events[1].Name != "exception" {
		t.Errorf("span events %+v, want the blockers read, then the error", events)
	}
}

// A wait that ends before the blocker threshold never asks.
func TestLockEndStopsTheLookup(t *testing.T) {
	set, tp, rec := traced(t, time.Hour)
	ww := New(Config[*conn, int]{Telemetry: set, HoldersOf: func(context.Context, View[*conn, int]) *holders.Blockage {
		t.Error("asked after the wait ended")
		return &holders.Blockage{}
	}})
	defer ww.Close()
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	ctx, w := ww.Start(ctx, "row", "for_update", "transaction")
	w.SetWaiter(&conn{id: 1}, "", nil, "SELECT 1 FOR UPDATE", nil)
	w.LookForBlockers(101, time.Second)
	w.End(ctx, telemetry.OutcomeAcquired, nil)
	parent.End()
	if spans := rec.Ended(); len(spans) != 2 || len(spans[0].Events()) != 0 {
		t.Errorf("ended spans %v: want the wait's, without a blockers read", spans)
	}
}

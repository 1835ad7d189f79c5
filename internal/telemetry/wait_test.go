package telemetry

import (
	"context"
	"errors"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// sqlStateError is an error carrying a SQLSTATE, as drivers' errors do.
type sqlStateError string

func (e sqlStateError) Error() string    { return "ERROR (SQLSTATE " + string(e) + ")" }
func (e sqlStateError) SQLState() string { return string(e) }

func TestOutcomes(t *testing.T) {
	lost, timeout := errors.New("lost"), errors.New("writer lock timeout")
	o := Outcomes{Lost: lost, Timeout: timeout}
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, OutcomeAcquired},
		{fmt.Errorf("wrapped: %w", lost), OutcomeLost},
		{context.Canceled, OutcomeCanceled},
		{context.DeadlineExceeded, OutcomeTimeout},
		{timeout, OutcomeTimeout},
		{sqlStateError("40P01"), OutcomeDeadlock},
		{sqlStateError("55P03"), OutcomeTimeout},
		{sqlStateError("57014"), OutcomeCanceled},
		{sqlStateError("23505"), OutcomeError},
		{errors.New("other"), OutcomeError},
	} {
		if got := o.Of(c.err); got != c.want {
			t.Errorf("Of(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// A wait in a recorded trace has a span named after its kind, with its
// holder and outcome; outside a trace, without root spans, none.
func TestWaitSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	set := New(Config{TracerProvider: tp, System: "postgresql", Pool: "test"})
	defer set.Close()

	var outside Wait
	set.StartWait(context.Background(), &outside, "advisory", "exclusive", "session")
	if outside.Recording() || !set.WantsHolder(&outside) {
		t.Fatalf("outside a trace: recording %v, wants its holder %v (for an orphan span)", outside.Recording(), set.WantsHolder(&outside))
	}

	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	var w Wait
	set.StartWait(ctx, &w, "row", "for_update", "transaction", AttrLockKeys.String("7"))
	set.HeldBy(&w, holders.Holder{Database: "orders", Conn: 2, PID: 900, Site: "app.go:10"})
	set.Record(ctx, &w, OutcomeDeadlock)
	w.Finish(OutcomeDeadlock, sqlStateError("40P01"))
	parent.End()

	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != "lock.wait row" {
		t.Fatalf("ended spans %v, want the wait's and the request's", spans)
	}
	attrs := map[string]string{}
	for _, a := range spans[0].Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	for k, want := range map[string]string{
		"lockhooks.lock.kind": "row", "lockhooks.lock.outcome": "deadlock", "lockhooks.holder.backend_pid": "900",
		"lockhooks.holder.call_site": "app.go:10", "db.response.status_code": "40P01", "error.type": "deadlock",
		"lockhooks.lock.keys": "7", "db.system.name": "postgresql",
	} {
		if attrs[k] != want {
			t.Errorf("%s = %q, want %q", k, attrs[k], want)
		}
	}
}

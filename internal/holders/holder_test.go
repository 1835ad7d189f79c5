package holders

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// spanOf is a valid span context of the trace tid.
func spanOf(t *testing.T, tid string) trace.SpanContext {
	t.Helper()
	id, err := trace.TraceIDFromHex(tid)
	if err != nil {
		t.Fatal(err)
	}
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: id, SpanID: sid, Remote: true})
}

// The page's JSON of a holder: every field under its name, in its order,
// and nothing of what only the messages use (Running, DatabaseNumber,
// Span), so /debug/locks reads as it always has.
func TestJSONNamesTheFieldsThePageShows(t *testing.T) {
	h := Holder{Process: "web-7/4711:x", Database: "orders", Conn: 3, PID: 812, Key: "42", Site: "app/jobs.go:17",
		Since: time.Date(2026, 1, 2, 3, 4, 5, 6000000, time.UTC), Statement: "SELECT 1", State: "idle in transaction",
		SiteKind: SiteTook, Depth: 2, Queued: true, WaitSeconds: 1.5, Running: true, DatabaseNumber: 9}
	h = h.WithSpan(spanOf(t, "4bf92f3577b34da6a3ce929d0e0e4736"))
	for _, c := range []struct {
		h    Holder
		want string
	}{
		{h, `{"process":"web-7/4711:x","database":"orders","conn":3,"pid":812,"key":"42","site":"app/jobs.go:17",` +
			`"since":"2026-01-02T03:04:05.006Z","statement":"SELECT 1","state":"idle in transaction",` +
			`"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","site_kind":"took_lock","depth":2,"queued":true,"wait_seconds":1.5}`},
		{Holder{}, `{"conn":0}`},
		{Holder{Running: true, DatabaseNumber: 4, Span: h.Span}, `{"conn":0}`},
	} {
		got, err := json.Marshal(c.h)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.want {
			t.Errorf("JSON of %#v:\n got %s\nwant %s", c.h, got, c.want)
		}
	}
}

// Who names the connection: its number, its database (by pool name, or
// by another process's number for it), its process and its backend.
func TestWhoNamesTheConnection(t *testing.T) {
	for _, c := range []struct {
		h    Holder
		want string
	}{
		{Holder{}, "a connection"},
		{Holder{Conn: 3, Database: "orders", PID: 812}, `connection #3 of "orders" (backend pid 812)`},
		{Holder{Conn: 3, Database: "orders", Process: "web-7/4711", PID: 812}, `connection #3 of "orders" in process web-7/4711 (backend pid 812)`},
		{Holder{Conn: 5, DatabaseNumber: 1, Process: "web-2/12"}, "connection #5 of database 1 in process web-2/12"},
		{Holder{Conn: 5, Database: "jobs", DatabaseNumber: 1}, `connection #5 of "jobs"`},
		{Holder{PID: 9}, "a connection (backend pid 9)"},
	} {
		if got := c.h.Who(); got != c.want {
			t.Errorf("Who of %+v:\n got %s\nwant %s", c.h, got, c.want)
		}
	}
}

// Where says what Site is by SiteKind, or the statement that holds the
// lock when the holder runs it, and nothing when it knows no site.
func TestWhereSaysWhatTheSiteIs(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, c := range []struct {
		h    Holder
		want string
	}{
		{Holder{}, ""},
		{Holder{SiteKind: SiteTook}, ""},
		{Holder{Site: "a.go:1"}, ""},
		{Holder{Site: "a.go:1", SiteKind: SiteTook}, "which took it at a.go:1"},
		{Holder{Site: "a.go:1", SiteKind: SiteBegan}, "in a transaction begun at a.go:1"},
		{Holder{Site: "a.go:1", SiteKind: SiteLater}, "in a transaction that ran a statement at a.go:1"},
		{Holder{Site: "a.go:1", SiteKind: SiteTook, Statement: "UPDATE t", Running: true}, `running the statement "UPDATE t"`},
		{Holder{Site: "a.go:1", SiteKind: SiteTook, Statement: "UPDATE t"}, "which took it at a.go:1"},
		{Holder{Statement: long, Running: true}, `running the statement "` + long[:200] + `"`},
	} {
		if got := c.h.Where(); got != c.want {
			t.Errorf("Where of %+v:\n got %s\nwant %s", c.h, got, c.want)
		}
	}
}

// String is who, where, for how long, the backend's state, its last
// statement and its trace, in that order; a queued holder says what it
// waits in and for how long instead of how long it holds.
func TestStringNamesTheHolderOneWay(t *testing.T) {
	span := spanOf(t, "4bf92f3577b34da6a3ce929d0e0e4736")
	for _, c := range []struct {
		h    Holder
		want string
	}{
		{Holder{Conn: 1, Database: "db"}, `connection #1 of "db"`},
		{Holder{Conn: 1, Database: "db", PID: 7, Site: "a.go:1", SiteKind: SiteBegan, State: "idle in transaction", Statement: "UPDATE t"}.WithSpan(span),
			`connection #1 of "db" (backend pid 7), in a transaction begun at a.go:1, idle in transaction, last statement "UPDATE t", trace 4bf92f3577b34da6a3ce929d0e0e4736`},
		{Holder{Conn: 1, Database: "db", Statement: "INSERT INTO t VALUES (1)", Running: true},
			`connection #1 of "db", running the statement "INSERT INTO t VALUES (1)"`},
		{Holder{Conn: 5, DatabaseNumber: 1, Process: "web-2/12", PID: 8170, Site: "b.go:9", SiteKind: SiteBegan, Queued: true, WaitSeconds: 2.14,
			Statement: "UPDATE t SET v = 2", State: "active", Since: time.Now()},
			`connection #5 of database 1 in process web-2/12 (backend pid 8170), in a transaction begun at b.go:9, waiting 2.1s in "UPDATE t SET v = 2"`},
		{Holder{Conn: 5, Queued: true}, "connection #5, waiting"},
		{Holder{Conn: 5, Statement: strings.Repeat("y", 200)}, `connection #5, last statement "` + strings.Repeat("y", 120) + `"`},
	} {
		if got := c.h.String(); got != c.want {
			t.Errorf("String of %+v:\n got %s\nwant %s", c.h, got, c.want)
		}
	}

	// How long it has held the lock, to the millisecond.
	h := Holder{Conn: 2, Database: "db", Site: "a.go:1", SiteKind: SiteTook, Since: time.Now().Add(-12300 * time.Millisecond)}
	got := h.String()
	rest, ok := strings.CutPrefix(got, `connection #2 of "db", which took it at a.go:1, for `)
	if !ok {
		t.Fatalf("String of a held lock: %s", got)
	}
	d, err := time.ParseDuration(rest)
	if err != nil || d < 12300*time.Millisecond || d > time.Minute || d != d.Round(time.Millisecond) {
		t.Errorf("held for %q (%v), want about 12.3s to the millisecond", rest, err)
	}
}

// LogArgs are slog key-value pairs: the holder as String names it, then
// each fact that is known, under its fixed key, in a fixed order.
func TestLogArgsAreTheKnownFactsInOrder(t *testing.T) {
	h := Holder{Process: "web-1/4711", Database: "jobs", Conn: 3, PID: 8161, Site: "jobs/run.go:7", SiteKind: SiteBegan,
		Since: time.Now().Add(-time.Second)}.WithSpan(spanOf(t, "4bf92f3577b34da6a3ce929d0e0e4736"))
	args := h.LogArgs()
	var keys []string
	for i := 0; i < len(args); i += 2 {
		keys = append(keys, args[i].(string))
	}
	if got, want := strings.Join(keys, " "), "holder holder_process holder_database holder_connection holder_pid holder_site holder_age holder_trace_id"; got != want {
		t.Errorf("keys %s, want %s", got, want)
	}
	if s, _ := args[1].(string); !strings.HasPrefix(s, `connection #3 of "jobs" in process web-1/4711 (backend pid 8161), in a transaction begun at jobs/run.go:7, for 1`) {
		t.Errorf("holder %q", args[1])
	}
	if got := fmt.Sprint(args[7], " ", args[9]); got != "3 8161" {
		t.Errorf("connection and pid %q, want them as numbers", got)
	}
	if _, ok := args[7].(uint64); !ok {
		t.Errorf("holder_connection is a %T, want uint64", args[7])
	}
	if _, ok := args[9].(int32); !ok {
		t.Errorf("holder_pid is a %T, want int32", args[9])
	}
	if got := (Holder{}).LogArgs(); len(got) != 2 || got[0] != "holder" || got[1] != "a connection" {
		t.Errorf("LogArgs of an unknown holder: %v", got)
	}
}

// WithSpan sets the span and the trace id from it; an invalid span keeps
// the trace id the holder had (another process's, as it published it).
func TestWithSpanSetsTheTrace(t *testing.T) {
	span := spanOf(t, "4bf92f3577b34da6a3ce929d0e0e4736")
	h := Holder{Conn: 1}.WithSpan(span)
	if !h.Span.Equal(span) || h.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("with a valid span: %+v", h)
	}
	h = Holder{Conn: 1, TraceID: "published"}.WithSpan(trace.SpanContext{})
	if h.Span.IsValid() || h.TraceID != "published" {
		t.Errorf("with no span: %+v", h)
	}
}

// SameConnection compares the connection (number, database, process, the
// other process's database number), not what it holds or where.
func TestSameConnection(t *testing.T) {
	a := Holder{Conn: 3, Database: "orders", Process: "web-1/1", DatabaseNumber: 2, Key: "1", Site: "a.go:1", PID: 7}
	same := Holder{Conn: 3, Database: "orders", Process: "web-1/1", DatabaseNumber: 2, Key: "2", Site: "b.go:2", Queued: true}
	if !a.SameConnection(same) || !same.SameConnection(a) {
		t.Errorf("%+v and %+v are one connection", a, same)
	}
	for _, o := range []Holder{
		{Conn: 4, Database: "orders", Process: "web-1/1", DatabaseNumber: 2},
		{Conn: 3, Database: "orders#2", Process: "web-1/1", DatabaseNumber: 2},
		{Conn: 3, Database: "orders", Process: "web-2/1", DatabaseNumber: 2},
		{Conn: 3, Database: "orders", Process: "web-1/1", DatabaseNumber: 5},
	} {
		if a.SameConnection(o) {
			t.Errorf("%+v and %+v are different connections", a, o)
		}
	}
}

// A connection as the holder of a lock it took: the key, the site, since
// when and the span, named the way Where says it.
func TestTookLock(t *testing.T) {
	since, span := time.Now().Add(-time.Second), spanOf(t, "4bf92f3577b34da6a3ce929d0e0e4736")
	h := Holder{Database: "orders", Conn: 2, PID: 102}.TookLock("7", "jobs.go:7", since, span)
	if h.Key != "7" || h.Site != "jobs.go:7" || !h.Since.Equal(since) || h.SiteKind != SiteTook || !h.Span.Equal(span) || h.TraceID != span.TraceID().String() {
		t.Errorf("took: %+v", h)
	}
	if !strings.Contains(h.String(), "which took it at jobs.go:7") {
		t.Errorf("named %q", h.String())
	}
}

package pgblocking

import (
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

func describe(k advisorykey.Key) string { return "key " + k.Number() }

// A holder in another process, as its identity makes it a holder of the
// model: it names its process, database, connection, lock and site, and
// carries its trace as a remote span.
func TestHolderOf(t *testing.T) {
	since := time.Now().Add(-12300 * time.Millisecond)
	id := &identity.Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: since,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	h := HolderOf(id, describe)
	h.PID = 8161
	got := h.String()
	for _, s := range []string{"connection #3 of database 1 in process web-1/4711 (backend pid 8161), which took it at jobs/leader.go:42, for 12.3",
		"trace 4bf92f3577b34da6a3ce929d0e0e4736"} {
		if !strings.Contains(got, s) {
			t.Errorf("%q does not say %q", got, s)
		}
	}
	if h.Key != "key 42" || !h.Span.IsValid() || !h.Span.IsRemote() {
		t.Errorf("key %q, span %v: want key 42 and the holder's span, remote", h.Key, h.Span)
	}
	tx := &identity.Holder{Process: "web-1/4711", Database: 1, Pool: "jobs", Conn: 3, Holds: "tx", Site: "jobs/run.go:7"}
	if got, want := HolderOf(tx, describe).Who(), `connection #3 of "jobs" in process web-1/4711`; got != want {
		t.Errorf("who:\n got %s\nwant %s", got, want)
	}
}

// A backend is this process's connection where ours says so, another
// process's where its identity says so, nobody's otherwise; the server's
// view completes it.
func TestIdentify(t *testing.T) {
	none := func() (holders.Holder, bool) { return holders.Holder{}, false }
	other := identity.Holder{Process: "web-2/12", Database: 1, Conn: 5, Holds: "tx", Site: "jobs/b.go:9"}
	s := holders.Blocker{PID: 8170, Depth: 1, Waiting: true, WaitSeconds: 2.1, State: "active", XactSeconds: 3,
		Query: "UPDATE t SET v = 2 WHERE id = 1", ApplicationName: other.AppName()}
	h, ok := Identify(s, none, describe)
	if !ok || h.Process != "web-2/12" || h.PID != 8170 || !h.Queued || h.WaitSeconds != 2.1 || h.Statement != s.Query || h.Since.IsZero() {
		t.Errorf("another process's waiting backend: %+v, %v", h, ok)
	}
	if _, ok := Identify(holders.Blocker{PID: 1, ApplicationName: "psql", Query: "SELECT 1"}, none, describe); ok {
		t.Error("a backend without an identity was identified")
	}
	mine := func() (holders.Holder, bool) {
		return holders.Holder{Database: "orders", Conn: 2, SiteKind: holders.SiteTook, Key: "key 7", Since: time.Now()}, true
	}
	h, ok = Identify(holders.Blocker{PID: 900, State: "idle", XactSeconds: -1, Query: "SELECT 1"}, mine, describe)
	if !ok || h.Conn != 2 || h.PID != 900 || h.State != "idle" || h.Statement != "" || h.Queued {
		t.Errorf("this process's session-lock holder: %+v, %v", h, ok)
	}

	// A closed connection of this process, last seen in its own lock
	// statement (an annotated text that names no since): held since that
	// statement ended, and no process named.
	closed := identity.Holder{Process: identity.ProcessLabel(), Database: 1, Conn: 9, Holds: "lock 7", Site: "jobs/l.go:1"}
	s = holders.Blocker{PID: 901, State: "idle", StateSeconds: 4, XactSeconds: -1, Query: closed.Annotation() + "SELECT pg_advisory_lock(7)"}
	h, ok = Identify(s, none, describe)
	if !ok || h.Process != "" || h.Key != "key 7" || time.Since(h.Since) < 4*time.Second || h.Statement != "" {
		t.Errorf("a closed connection's lock: %+v, %v", h, ok)
	}
}

// A decoded identity, whatever another session showed, becomes a holder
// of the model that names itself without failing (the decoding itself is
// fuzzed in internal/identity).
func FuzzHolderOf(f *testing.F) {
	id := identity.Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: time.Now(),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	f.Add(id.AppName(), id.Annotation()+"SELECT 1")
	f.Add("lockhooks a/1#1.1 tx", "/*lockhooks holder: process=a/1 conn=1 holds=lock:1/2-shared*/")
	f.Add("lockhooks a/1#1.1 lock", "/*lockhooks holder: process=a/1 conn=1 holds=lock:x/-shared*/")
	f.Fuzz(func(t *testing.T, app, query string) {
		if got := identity.Decode(app, query); got != nil {
			h := HolderOf(got, describe)
			_ = h.String()
			if h.Key != "" && !strings.HasPrefix(got.Holds, "lock") {
				t.Errorf("key %q from holds %q", h.Key, got.Holds)
			}
		}
	})
}

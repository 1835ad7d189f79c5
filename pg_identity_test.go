package lockhooks

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

// A holder in another process, as its identity makes it a holder of the
// model: a slow-wait line and an error name it like any other, with its
// process; the holders at the root come before those queued ahead.
func TestIdentityAsHolder(t *testing.T) {
	since := time.Now().Add(-12300 * time.Millisecond)
	id := &identity.Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: since,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	h := holderOf(id)
	h.PID = 8161
	got := h.String()
	for _, s := range []string{"connection #3 of database 1 in process web-1/4711 (backend pid 8161), which took it at jobs/leader.go:42, for 12.3",
		"trace 4bf92f3577b34da6a3ce929d0e0e4736"} {
		if !strings.Contains(got, s) {
			t.Errorf("%q does not say %q", got, s)
		}
	}
	if h.Key != "42" || !h.Span.IsValid() || !h.Span.IsRemote() {
		t.Errorf("key %q, span %v: want 42 and the holder's span, remote", h.Key, h.Span)
	}
	tx := &identity.Holder{Process: "web-1/4711", Database: 1, Pool: "jobs", Conn: 3, Holds: "tx", Site: "jobs/run.go:7"}
	if got, want := holderOf(tx).Who(), `connection #3 of "jobs" in process web-1/4711`; got != want {
		t.Errorf("who:\n got %s\nwant %s", got, want)
	}

	// The chain: 8161 (another process) holds, 8170 (a third) waits for it
	// and blocks the waiter too, 8180 (no lockhooks) holds something else.
	app := func(id identity.Holder) string { return id.AppName() }
	b := &holders.Blockage{At: time.Now()}
	addBlockers(b, []holders.Blocker{
		{PID: 8170, Depth: 1, Waiting: true, WaitSeconds: 2.1, State: "active", XactSeconds: 3, Query: "UPDATE t SET v = 2 WHERE id = 1",
			ApplicationName: app(identity.Holder{Process: "web-2/12", Database: 1, Conn: 5, Holds: "tx", Site: "jobs/b.go:9"})},
		{PID: 8161, Depth: 2, State: "idle in transaction", XactSeconds: 12.3, Query: "UPDATE t SET v = 1 WHERE id = 1", ApplicationName: app(*tx)},
		{PID: 8180, Depth: 1, State: "idle", XactSeconds: -1, ApplicationName: "psql", Query: "SELECT pg_advisory_lock(1)"},
	}, nil)
	line := b.String()
	for _, s := range []string{`connection #3 of "jobs" in process web-1/4711 (backend pid 8161), in a transaction begun at jobs/run.go:7, for 12.3`,
		`last statement "UPDATE t SET v = 1 WHERE id = 1"`, `backend pid 8180 ("psql"), idle`,
		"queued ahead of this wait, waiting too: connection #5 of database 1 in process web-2/12 (backend pid 8170), in a transaction begun at jobs/b.go:9, waiting 2.1s in \"UPDATE t SET v = 2 WHERE id = 1\""} {
		if !strings.Contains(line, s) {
			t.Errorf("%q does not say %q", line, s)
		}
	}
	if strings.Index(line, "8161") > strings.Index(line, "8170") {
		t.Errorf("the root holder is not named first: %s", line)
	}
	args := fmt.Sprintln(b.LogArgs()...)
	for _, s := range []string{"holder_process web-1/4711", "holder_pid 8161", "holder_site jobs/run.go:7", "blocking_pids 8180", "queued_pids 8170"} {
		if !strings.Contains(args, s) {
			t.Errorf("log attributes %q lack %q", args, s)
		}
	}
}

// A decoded identity, whatever another session showed, becomes a holder
// of the model that names itself without failing (the decoding itself is
// fuzzed in internal/identity).
func FuzzIdentityAsHolder(f *testing.F) {
	id := identity.Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: time.Now(),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	f.Add(id.AppName(), id.Annotation()+"SELECT 1")
	f.Add("lockhooks a/1#1.1 tx", "/*lockhooks holder: process=a/1 conn=1 holds=lock:1/2-shared*/")
	f.Add("lockhooks a/1#1.1 lock", "/*lockhooks holder: process=a/1 conn=1 holds=lock:x/-shared*/")
	f.Fuzz(func(t *testing.T, app, query string) {
		if got := identity.Decode(app, query); got != nil {
			h := holderOf(got)
			_ = h.String()
			if h.Key != "" && !strings.HasPrefix(got.Holds, "lock") {
				t.Errorf("key %q from holds %q", h.Key, got.Holds)
			}
		}
	})
}

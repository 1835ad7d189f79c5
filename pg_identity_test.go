package lockhooks

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The compact identity fits application_name's 63 bytes whatever the host,
// site and pool, and reads back as written (what had to be left out stays
// out).
func TestIdentityAppNameRoundTrip(t *testing.T) {
	since := time.UnixMilli(1_714_557_600_123)
	for _, tc := range []struct {
		name string
		id   holderIdentity
		want holderIdentity // what parses back
	}{{
		name: "transaction",
		id:   holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "jobs/leader.go:42"},
		want: holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "jobs/leader.go:42"},
	}, {
		name: "session lock, the keys are left to the annotation",
		id:   holderIdentity{Process: "web-1/4711", Database: 2, Conn: 17, Holds: "lock 42", Site: "jobs/leader.go:42", Since: since},
		want: holderIdentity{Process: "web-1/4711", Database: 2, Conn: 17, Holds: "lock", Site: "jobs/leader.go:42", Since: since},
	}, {
		name: "a pod name and a long site: the host keeps its start and end, the site its end",
		id: holderIdentity{Process: "jobs-worker-7d9f8b6c5-x2x4q/1", Database: 1, Conn: 12345, Holds: "lock 7",
			Site: "internal/scheduler/leader_election.go:1234", Since: since},
		want: holderIdentity{Process: "jobs-worker~-x2x4q/1", Database: 1, Conn: 12345, Holds: "lock",
			Site: "~r_election.go:1234"},
	}, {
		name: "a long directory is left out first",
		id: holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx",
			Site: "internal/scheduler/leadership/lease.go:42"},
		want: holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "lease.go:42"},
	}, {
		name: "room for the pool, never for the trace",
		id: holderIdentity{Process: "a/1", Database: 1, Conn: 1, Holds: "tx", Site: "x.go:1", Pool: "jobs",
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"},
		want: holderIdentity{Process: "a/1", Database: 1, Conn: 1, Holds: "tx", Site: "x.go:1", Pool: "jobs"},
	}, {
		name: "connection only",
		id:   holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3},
		want: holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.id.appName()
			if len(s) > maxAppName || !strings.HasPrefix(s, appNamePrefix) {
				t.Fatalf("appName() = %q (%d bytes)", s, len(s))
			}
			got := parseAppName(s)
			if got == nil {
				t.Fatalf("parseAppName(%q) = nil", s)
			}
			if got.Since.UnixMilli() != tc.want.Since.UnixMilli() {
				t.Errorf("since %v, want %v (%q)", got.Since, tc.want.Since, s)
			}
			got.Since, tc.want.Since = time.Time{}, time.Time{}
			if *got != tc.want {
				t.Errorf("parseAppName(%q) = %+v, want %+v", s, *got, tc.want)
			}
		})
	}
}

// The annotation carries every field, and nothing in it can end the
// comment or start a nested one.
func TestIdentityAnnotationRoundTrip(t *testing.T) {
	id := holderIdentity{Process: "web-1/4711", Database: 2, Pool: "jobs", Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42",
		Since: time.UnixMilli(1_714_557_600_123).UTC(), TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	a := id.annotation()
	q := a + "SELECT 1"
	got := parseAnnotation(q)
	if got == nil || *got != id {
		t.Fatalf("parseAnnotation(%q) = %+v, want %+v", q, got, id)
	}
	if sc := got.spanContext(); !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != id.TraceID {
		t.Errorf("span context %v", sc)
	}
	// Hostile text is cleaned before it is written.
	for _, s := range []string{"*/ DROP TABLE x; /*", "a'b", `c\d`, "e f", "$1", "--", "ünï"} {
		tok := safeToken(s, "_")
		if strings.ContainsAny(tok, "*'\\ $") || strings.Contains(tok, "--x") {
			t.Errorf("safeToken(%q) = %q", s, tok)
		}
		id := holderIdentity{Process: "p/1", Conn: 1, Site: tok}
		if n := strings.Count(id.annotation(), "*/"); n != 1 {
			t.Errorf("annotation with site %q has %d comment ends", tok, n)
		}
	}
	// A comment cut by track_activity_query_size is not read.
	if got := parseAnnotation(a[:len(a)-5]); got != nil {
		t.Errorf("cut annotation parsed as %+v", got)
	}
}

// Decoding a backend: the annotation completes application_name when they
// name the same connection; otherwise application_name wins (it is the
// client's now, the statement may be older).
func TestIdentityDecode(t *testing.T) {
	since := time.UnixMilli(1_714_557_600_123).UTC()
	full := holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: since,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	app, query := full.appName(), full.annotation()+"SELECT …"
	if got := decodeIdentity(app, query); got == nil || *got != full {
		t.Errorf("both: %+v, want %+v", got, full)
	}
	if got := decodeIdentity("", query); got == nil || got.TraceID != full.TraceID {
		t.Errorf("annotation only (the user named the application): %+v", got)
	}
	if got := decodeIdentity(app, "UPDATE t SET v = 1"); got == nil || got.Site != full.Site || got.TraceID != "" {
		t.Errorf("application_name only: %+v", got)
	}
	tx := holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "jobs/run.go:7"}
	if got := decodeIdentity(tx.appName(), query); got == nil || got.Holds != "tx" || got.Site != "jobs/run.go:7" {
		t.Errorf("a transaction after a lock: %+v", got)
	}
	other := holderIdentity{Process: "web-2/99", Database: 1, Conn: 3, Holds: "tx", Site: "a.go:1"}
	if got := decodeIdentity(other.appName(), query); got == nil || got.Process != "web-2/99" {
		t.Errorf("another connection's statement: %+v", got)
	}
	for _, s := range []string{"", "psql", "lockhooks", "lockhooks x", "lockhooks a/1#x.1", "lockhooks_debug_blocker", "lockhooks a/1#1.2 @zzzzzzzzzzzzzzzzzz"} {
		if id := parseAppName(s); id != nil && s != "lockhooks a/1#1.2 @zzzzzzzzzzzzzzzzzz" {
			t.Errorf("parseAppName(%q) = %+v, want nil", s, id)
		}
	}
}

// A holder in another process, as its identity makes it a holder of the
// model: a slow-wait line and an error name it like any other, with its
// process; the holders at the root come before those queued ahead.
func TestIdentityAsHolder(t *testing.T) {
	since := time.Now().Add(-12300 * time.Millisecond)
	id := &holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: since,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	h := id.holder()
	h.PID = 8161
	got := h.String()
	for _, s := range []string{"connection #3 of database 1 in process web-1/4711 (backend pid 8161), which took it at jobs/leader.go:42, for 12.3",
		"trace 4bf92f3577b34da6a3ce929d0e0e4736"} {
		if !strings.Contains(got, s) {
			t.Errorf("%q does not say %q", got, s)
		}
	}
	if h.Key != "42" || !h.span.IsValid() || !h.span.IsRemote() {
		t.Errorf("key %q, span %v: want 42 and the holder's span, remote", h.Key, h.span)
	}
	tx := &holderIdentity{Process: "web-1/4711", Database: 1, Pool: "jobs", Conn: 3, Holds: "tx", Site: "jobs/run.go:7"}
	if got, want := tx.holder().who(), `connection #3 of "jobs" in process web-1/4711`; got != want {
		t.Errorf("who:\n got %s\nwant %s", got, want)
	}

	// The chain: 8161 (another process) holds, 8170 (a third) waits for it
	// and blocks the waiter too, 8180 (no lockhooks) holds something else.
	app := func(id holderIdentity) string { return id.appName() }
	b := &blockage{at: time.Now()}
	b.add([]pgBlocker{
		{PID: 8170, Depth: 1, Waiting: true, WaitSeconds: 2.1, State: "active", XactSeconds: 3, Query: "UPDATE t SET v = 2 WHERE id = 1",
			ApplicationName: app(holderIdentity{Process: "web-2/12", Database: 1, Conn: 5, Holds: "tx", Site: "jobs/b.go:9"})},
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
	args := fmt.Sprintln(b.logArgs()...)
	for _, s := range []string{"holder_process web-1/4711", "holder_pid 8161", "holder_site jobs/run.go:7", "blocking_pids 8180", "queued_pids 8170"} {
		if !strings.Contains(args, s) {
			t.Errorf("log attributes %q lack %q", args, s)
		}
	}
}

// Decoding never fails on what other sessions show.
func FuzzDecodeIdentity(f *testing.F) {
	id := holderIdentity{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: time.Now(),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	f.Add(id.appName(), id.annotation()+"SELECT 1")
	f.Add("lockhooks a/1#1.1 tx", "/*lockhooks holder: process=a/1 conn=1 since=x*/")
	f.Add("lockhooks #.", "/*lockhooks holder: */")
	f.Add("locVhooks web-1/4711#1.3 lock jobs/leader.go:42 @mx51ln9h", "/*lockhooks holder: process=000000000000000 conn=1 holds=000000000000000000000000000000000000000*/") // found by the fuzzer: a 39-byte kind made a 69-byte application_name
	f.Fuzz(func(t *testing.T, app, query string) {
		if got := decodeIdentity(app, query); got != nil {
			_ = got.holder().String()
			_ = got.spanContext()
			if s := got.appName(); len(s) > maxAppName {
				t.Errorf("re-encoded %q is %d bytes", s, len(s))
			}
		}
	})
}

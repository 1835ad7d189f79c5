package identity

import (
	"strings"
	"testing"
	"time"
)

// The compact identity fits application_name's 63 bytes whatever the host,
// site and pool, and reads back as written (what had to be left out stays
// out).
func TestAppNameRoundTrip(t *testing.T) {
	since := time.UnixMilli(1_714_557_600_123)
	for _, tc := range []struct {
		name string
		id   Holder
		want Holder // what parses back
	}{{
		name: "transaction",
		id:   Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "jobs/leader.go:42"},
		want: Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "jobs/leader.go:42"},
	}, {
		name: "session lock, the keys are left to the annotation",
		id:   Holder{Process: "web-1/4711", Database: 2, Conn: 17, Holds: "lock 42", Site: "jobs/leader.go:42", Since: since},
		want: Holder{Process: "web-1/4711", Database: 2, Conn: 17, Holds: "lock", Site: "jobs/leader.go:42", Since: since},
	}, {
		name: "a pod name and a long site: the host keeps its start and end, the site its end",
		id: Holder{Process: "jobs-worker-7d9f8b6c5-x2x4q/1", Database: 1, Conn: 12345, Holds: "lock 7",
			Site: "internal/scheduler/leader_election.go:1234", Since: since},
		want: Holder{Process: "jobs-worker~-x2x4q/1", Database: 1, Conn: 12345, Holds: "lock",
			Site: "~r_election.go:1234"},
	}, {
		name: "a long directory is left out first",
		id: Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx",
			Site: "internal/scheduler/leadership/lease.go:42"},
		want: Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "lease.go:42"},
	}, {
		name: "room for the pool, never for the trace",
		id: Holder{Process: "a/1", Database: 1, Conn: 1, Holds: "tx", Site: "x.go:1", Pool: "jobs",
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"},
		want: Holder{Process: "a/1", Database: 1, Conn: 1, Holds: "tx", Site: "x.go:1", Pool: "jobs"},
	}, {
		name: "connection only",
		id:   Holder{Process: "web-1/4711", Database: 1, Conn: 3},
		want: Holder{Process: "web-1/4711", Database: 1, Conn: 3},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.id.AppName()
			if len(s) > maxAppName || !strings.HasPrefix(s, AppNamePrefix) {
				t.Fatalf("AppName() = %q (%d bytes)", s, len(s))
			}
			got := ParseAppName(s)
			if got == nil {
				t.Fatalf("ParseAppName(%q) = nil", s)
			}
			if got.Since.UnixMilli() != tc.want.Since.UnixMilli() {
				t.Errorf("since %v, want %v (%q)", got.Since, tc.want.Since, s)
			}
			got.Since, tc.want.Since = time.Time{}, time.Time{}
			if *got != tc.want {
				t.Errorf("ParseAppName(%q) = %+v, want %+v", s, *got, tc.want)
			}
		})
	}
}

// The annotation carries every field, and nothing in it can end the
// comment or start a nested one.
func TestAnnotationRoundTrip(t *testing.T) {
	id := Holder{Process: "web-1/4711", Database: 2, Pool: "jobs", Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42",
		Since: time.UnixMilli(1_714_557_600_123).UTC(), TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	a := id.Annotation()
	q := a + "SELECT 1"
	got := ParseAnnotation(q)
	if got == nil || *got != id {
		t.Fatalf("ParseAnnotation(%q) = %+v, want %+v", q, got, id)
	}
	if sc := got.SpanContext(); !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != id.TraceID {
		t.Errorf("span context %v", sc)
	}
	if tid, sid := TraceIDs(got.SpanContext()); tid != id.TraceID || sid != id.SpanID {
		t.Errorf("TraceIDs of the span context = %q, %q; want %q, %q", tid, sid, id.TraceID, id.SpanID)
	}
	// Hostile text is cleaned before it is written.
	for _, s := range []string{"*/ DROP TABLE x; /*", "a'b", `c\d`, "e f", "$1", "--", "ünï"} {
		tok := SafeToken(s, "_")
		if strings.ContainsAny(tok, "*'\\ $") || strings.Contains(tok, "--x") {
			t.Errorf("SafeToken(%q) = %q", s, tok)
		}
		id := Holder{Process: "p/1", Conn: 1, Site: tok}
		if n := strings.Count(id.Annotation(), "*/"); n != 1 {
			t.Errorf("annotation with site %q has %d comment ends", tok, n)
		}
	}
	// A comment cut by track_activity_query_size is not read.
	if got := ParseAnnotation(a[:len(a)-5]); got != nil {
		t.Errorf("cut annotation parsed as %+v", got)
	}
}

// Decoding a backend: the annotation completes application_name when they
// name the same connection; otherwise application_name wins (it is the
// client's now, the statement may be older).
func TestDecode(t *testing.T) {
	since := time.UnixMilli(1_714_557_600_123).UTC()
	full := Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: since,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	app, query := full.AppName(), full.Annotation()+"SELECT …"
	if got := Decode(app, query); got == nil || *got != full {
		t.Errorf("both: %+v, want %+v", got, full)
	}
	if got := Decode("", query); got == nil || got.TraceID != full.TraceID {
		t.Errorf("annotation only (the user named the application): %+v", got)
	}
	if got := Decode(app, "UPDATE t SET v = 1"); got == nil || got.Site != full.Site || got.TraceID != "" {
		t.Errorf("application_name only: %+v", got)
	}
	tx := Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "tx", Site: "jobs/run.go:7"}
	if got := Decode(tx.AppName(), query); got == nil || got.Holds != "tx" || got.Site != "jobs/run.go:7" {
		t.Errorf("a transaction after a lock: %+v", got)
	}
	other := Holder{Process: "web-2/99", Database: 1, Conn: 3, Holds: "tx", Site: "a.go:1"}
	if got := Decode(other.AppName(), query); got == nil || got.Process != "web-2/99" {
		t.Errorf("another connection's statement: %+v", got)
	}
	for _, s := range []string{"", "psql", "lockhooks", "lockhooks x", "lockhooks a/1#x.1", "lockhooks_debug_blocker", "lockhooks a/1#1.2 @zzzzzzzzzzzzzzzzzz"} {
		if id := ParseAppName(s); id != nil && s != "lockhooks a/1#1.2 @zzzzzzzzzzzzzzzzzz" {
			t.Errorf("ParseAppName(%q) = %+v, want nil", s, id)
		}
	}
}

// This process's label is host/pid and a nonce of four base-36
// characters, the same at every call; application_name carries it
// shortened, and an identity with either form is this process's.
func TestProcessLabel(t *testing.T) {
	label := ProcessLabel()
	who, nonce, ok := strings.Cut(label, ":")
	if !ok || len(nonce) != 4 || strings.Trim(nonce, "0123456789abcdefghijklmnopqrstuvwxyz") != "" {
		t.Fatalf("ProcessLabel() = %q: want host/pid:nonce, the nonce four base-36 characters", label)
	}
	if host, pid, _ := strings.Cut(who, "/"); host == "" || pid == "" || SafeToken(host, "-") != host {
		t.Errorf("ProcessLabel() = %q: want a safe host and a pid", label)
	}
	if ProcessLabel() != label {
		t.Errorf("the label changed: %q, then %q", label, ProcessLabel())
	}
	short := ShortProcessLabel()
	if len(short) > appNameProcessLen || (len(label) <= appNameProcessLen && short != label) {
		t.Errorf("ShortProcessLabel() = %q for %q", short, label)
	}
	for _, p := range []string{label, short} {
		if id := (&Holder{Process: p}); !id.OfThisProcess() {
			t.Errorf("an identity of process %q is not this process's", p)
		}
	}
	if id := (&Holder{Process: strings.TrimSuffix(label, nonce) + "zzzz"}); nonce != "zzzz" && id.OfThisProcess() {
		t.Errorf("another nonce %q is this process's", id.Process)
	}
}

// A long host keeps its start and its end (a pod's unique suffix) and the
// pid whole; a label too long for that is cut.
func TestShortProcess(t *testing.T) {
	for _, tc := range []struct{ p, want string }{
		{"web-1/4711:ab12", "web-1/4711:ab12"},
		{"jobs-worker-7d9f8b6c5-x2x4q/1", "jobs-worker~-x2x4q/1"},
		{"jobs-worker-7d9f8b6c5-x2x4q/1:ab12", "jobs-w~-x2x4q/1:ab12"},
		{"h/123456789012345678901234", "h/123456789012345678"},
	} {
		if got := shortProcess(tc.p, appNameProcessLen); got != tc.want || len(got) > appNameProcessLen {
			t.Errorf("shortProcess(%q) = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// The encoders are on every transaction's and every session lock's path:
// appended into a buffer with room, they allocate nothing (but for
// shortening a process label longer than application_name's share).
func TestAppendAllocatesNothing(t *testing.T) {
	id := Holder{Process: "web-1/4711:ab12", Database: 2, Pool: "jobs", Conn: 17, Holds: "lock 42", Site: "internal/scheduler/leader_election.go:1234",
		Since: time.UnixMilli(1_714_557_600_123), TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	var buf [512]byte
	for name, encode := range map[string]func(){
		"AppendAppName":    func() { _ = id.AppendAppName(buf[:0]) },
		"AppendAnnotation": func() { _ = id.AppendAnnotation(buf[:0]) },
	} {
		if n := testing.AllocsPerRun(100, encode); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}

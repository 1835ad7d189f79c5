package identity

import (
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Decoding never fails on what other sessions show, and what it decodes
// encodes again within application_name's bound.
func FuzzDecode(f *testing.F) {
	id := Holder{Process: "web-1/4711", Database: 1, Conn: 3, Holds: "lock 42", Site: "jobs/leader.go:42", Since: time.Now(),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	f.Add(id.AppName(), id.Annotation()+"SELECT 1")
	f.Add("lockhooks a/1#1.1 tx", "/*lockhooks holder: process=a/1 conn=1 since=x*/")
	f.Add("lockhooks #.", "/*lockhooks holder: */")
	f.Add("locVhooks web-1/4711#1.3 lock jobs/leader.go:42 @mx51ln9h", "/*lockhooks holder: process=000000000000000 conn=1 holds=000000000000000000000000000000000000000*/") // found by the fuzzer: a 39-byte kind made a 69-byte application_name
	f.Fuzz(func(t *testing.T, app, query string) {
		if got := Decode(app, query); got != nil {
			_ = got.SpanContext()
			if s := got.AppName(); len(s) > maxAppName {
				t.Errorf("re-encoded %q is %d bytes", s, len(s))
			}
		}
	})
}

// maxSinceMilli is the last millisecond of year 9999, the last an
// annotation's four-digit year can carry.
const maxSinceMilli = 253402300799999

// Any identity lockhooks writes reads back: the annotation whole, and
// application_name within its rules (the process shortened, the kind of
// hold without its keys, the site whole, without its directory, or "~" and
// its end, the time and the pool as room allows, never the trace), and
// decoding both gives the annotation's. The fuzzer's strings are made what
// the writers make them (safe tokens; a site ends in ":line"); a
// database's and a connection's number count up from 1 in a process.
func FuzzRoundTrip(f *testing.F) {
	f.Add("web-1/4711:ab12", "", "jobs/leader.go", uint32(1), uint32(3), uint8(2), int64(42), int64(1_714_557_600_123), []byte("0123456789abcdef01234567"))
	f.Add("jobs-worker-7d9f8b6c5-x2x4q/1:zz99", "127.0.0.1:5432/app", "internal/scheduler/leader_election.go", uint32(4000000000), uint32(4000000000), uint8(2), int64(-7), int64(0), []byte{})
	f.Add("a/1", "jobs", "x.go", uint32(0), uint32(0), uint8(1), int64(0), int64(-1), []byte{})
	f.Add("h", "p", "", uint32(9), uint32(9), uint8(0), int64(0), int64(5), []byte{})
	f.Fuzz(func(t *testing.T, process, pool, site string, db, conn uint32, kind uint8, key, sinceMs int64, traceBytes []byte) {
		id := Holder{Process: SafeToken(process, "_"), Pool: SafeToken(pool, "_"), Database: uint64(db), Conn: uint64(conn) + 1}
		if id.Process == "" {
			id.Process = "p"
		}
		if site != "" {
			id.Site = strings.ReplaceAll(SafeToken(site, "_"), "@", "_") + ":1"
		}
		switch kind % 3 {
		case 1:
			id.Holds = "tx"
		case 2:
			id.Holds = "lock"
			if key != 0 {
				id.Holds += " " + strconv.FormatInt(key, 10)
			}
		}
		if sinceMs >= 0 {
			id.Since = time.UnixMilli(sinceMs % (maxSinceMilli + 1)).UTC()
		}
		if len(traceBytes) >= 24 {
			id.TraceID, id.SpanID = hex.EncodeToString(traceBytes[:16]), hex.EncodeToString(traceBytes[16:24])
		}

		annotation := id.Annotation()
		if n := strings.Count(annotation, "*/"); n != 1 || !strings.HasSuffix(annotation, "*/ ") {
			t.Fatalf("annotation %q ends its comment %d times", annotation, n)
		}
		if got := ParseAnnotation(annotation + "SELECT 1"); got == nil || *got != id {
			t.Fatalf("ParseAnnotation(%q) = %+v, want %+v", annotation, got, id)
		}

		s := id.AppName()
		if len(s) > maxAppName || !strings.HasPrefix(s, AppNamePrefix) {
			t.Fatalf("AppName() = %q (%d bytes)", s, len(s))
		}
		a := ParseAppName(s)
		if a == nil {
			t.Fatalf("ParseAppName(%q) = nil", s)
		}
		holdsKind, _, _ := strings.Cut(id.Holds, " ")
		if a.Process != shortProcess(id.Process, appNameProcessLen) || a.Database != id.Database || a.Conn != id.Conn || a.Holds != holdsKind {
			t.Fatalf("ParseAppName(%q) = %+v: want process %q, database %d, connection %d, holds %q",
				s, a, shortProcess(id.Process, appNameProcessLen), id.Database, id.Conn, holdsKind)
		}
		if a.TraceID != "" || a.SpanID != "" {
			t.Errorf("ParseAppName(%q) has a trace: %+v", s, a)
		}
		head := len(AppNamePrefix) + len(a.Process) + 1 + len(strconv.FormatUint(id.Database, 10)) + 1 + len(strconv.FormatUint(id.Conn, 10))
		if holdsKind == "" {
			// A connection holding nothing is named, nothing more.
			if a.Site != "" || !a.Since.IsZero() || a.Pool != "" || len(s) != head {
				t.Errorf("ParseAppName(%q) = %+v: a connection that holds nothing", s, a)
			}
		} else {
			head += 1 + len(holdsKind)
			var since string
			if !id.Since.IsZero() && holdsKind != "tx" {
				since = "@" + strconv.FormatInt(id.Since.UnixMilli(), 36)
			}
			checkSite(t, s, a.Site, id.Site, head, since)
			rest := strings.TrimSuffix(s, " %"+a.Pool)
			switch {
			case a.Pool != "" && a.Pool != id.Pool:
				t.Errorf("ParseAppName(%q): pool %q, want %q", s, a.Pool, id.Pool)
			case id.Pool != "" && a.Pool == "" && len(s)+2+len(id.Pool) <= maxAppName:
				t.Errorf("AppName() = %q leaves out pool %q, which fits", s, id.Pool)
			}
			switch {
			case !a.Since.IsZero() && (since == "" || a.Since.UnixMilli() != id.Since.UnixMilli()):
				t.Errorf("ParseAppName(%q): since %v, want %v (holds %q)", s, a.Since, id.Since, id.Holds)
			case since != "" && a.Since.IsZero() && len(rest)+1+len(since) <= maxAppName:
				t.Errorf("AppName() = %q leaves out the time %q, which fits", s, since)
			}
		}

		if got := Decode(s, annotation+"SELECT 1"); got == nil || *got != id {
			t.Errorf("Decode(%q, %q) = %+v, want %+v", s, annotation, got, id)
		}
	})
}

// checkSite checks the site application_name s carries (got) for the site
// written (want) after head bytes, with since the time field it may also
// carry: the whole site, its file:line, or "~" and its end of at least
// minAppNameSite bytes; the whole site when it fits with the time, and
// some of it when there is room for the shortest.
func checkSite(t *testing.T, s, got, want string, head int, since string) {
	t.Helper()
	base := want[strings.LastIndexByte(want, '/')+1:]
	tail, cut := strings.CutPrefix(got, "~")
	switch {
	case got == "" || got == want || got == base:
	case cut && len(got) >= minAppNameSite && strings.HasSuffix(want, tail):
	default:
		t.Errorf("AppName() = %q carries site %q, which is not a form of %q", s, got, want)
	}
	if want == "" {
		return
	}
	room := maxAppName - head - 1 // the space before the site
	if since != "" {
		room -= 1 + len(since)
	}
	switch {
	case len(want) <= room && got != want:
		t.Errorf("AppName() = %q carries site %q, not %q, which fits", s, got, want)
	case room >= minAppNameSite && got == "":
		t.Errorf("AppName() = %q leaves out site %q with %d bytes of room", s, want, room)
	}
}

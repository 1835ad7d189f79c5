package pgsession

import (
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// The queue keeps one request per backend pid: requests for the same
// incarnation merge their keys and keep the latest quiet time, one for
// another incarnation replaces the older (that backend is gone), and a
// target whose incarnation is unknown is never queued (its pid cannot be
// told from another's). Each Add wakes the monitor once.
func TestEndQueueMergesByIncarnation(t *testing.T) {
	q := NewEndQueue()
	t0 := time.Now()
	k1, k2, k3 := advisorykey.Key{K1: 1}, advisorykey.Key{K1: 2}, advisorykey.Key{K1: 3}

	q.Add(EndTarget{PID: 7, Quiet: t0}, []advisorykey.Key{k1}, false)
	if !q.Empty() {
		t.Fatal("a target without an incarnation was queued")
	}
	q.Add(EndTarget{PID: 7, Incarnation: "1@9", Quiet: t0}, []advisorykey.Key{k1}, false)
	q.Add(EndTarget{PID: 7, Incarnation: "1@9", Quiet: t0.Add(time.Second), InFlight: true, SentQuiet: t0.Add(2 * time.Second), Sent: "SELECT 1"}, []advisorykey.Key{k2}, false)
	select {
	case <-q.Kick():
	default:
		t.Fatal("Add did not wake the monitor")
	}
	reqs := q.Take()
	r := reqs[7]
	if len(reqs) != 1 || r == nil || len(r.Keys) != 2 || r.Any || !r.Target.Quiet.Equal(t0.Add(time.Second)) || !r.Target.InFlight || r.Target.Sent != "SELECT 1" {
		t.Fatalf("merged request %+v", r)
	}
	if !q.Empty() {
		t.Fatal("Take left requests behind")
	}

	// Put back while a newer incarnation of the pid was queued: the newer
	// one stays, alone.
	q.Add(EndTarget{PID: 7, Incarnation: "2@9", Quiet: t0}, []advisorykey.Key{k3}, true)
	q.PutBack(reqs)
	r = q.Take()[7]
	if r.Target.Incarnation != "2@9" || len(r.Keys) != 1 || r.Keys[0] != k3 || !r.Any {
		t.Fatalf("after PutBack under a newer incarnation: %+v", r)
	}

	// Put back onto the same incarnation: the keys join.
	q.Add(EndTarget{PID: 7, Incarnation: "2@9", Quiet: t0}, []advisorykey.Key{k1}, false)
	q.PutBack(map[int32]*EndRequest{7: r})
	if r := q.Take()[7]; len(r.Keys) != 2 || !r.Any {
		t.Fatalf("after PutBack onto the same incarnation: %+v", r)
	}
}

// Only the value IncarnationExpr reads (two integers) is an incarnation:
// anything else is "", never a literal in EndBackend's statement.
func TestReadIncarnation(t *testing.T) {
	for s, want := range map[string]string{
		"1700000000000000@1690000000000000": "1700000000000000@1690000000000000",
		"":                                  "",
		"1@":                                "",
		"@1":                                "",
		"1@2' OR true --":                   "",
		"x@1":                               "",
	} {
		if got := ReadIncarnation(s); got != want {
			t.Errorf("ReadIncarnation(%q) = %q, want %q", s, got, want)
		}
	}
}

package pgserver

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// backend is a shown backend of a read, blocked by blockers.
func backend(pid int32, blockers ...int32) *Backend {
	return &Backend{Shown: true, Row: holders.Blocker{PID: pid, State: "active"}, QueryAge: 1.5, Blockers: blockers}
}

// A holds, C waits for A, B waits behind C: B's chain is C (queued ahead,
// depth 1) then A (the root, depth 2); a backend met twice is listed once.
func TestChainFollowsToTheRoot(t *testing.T) {
	backends := map[int32]*Backend{1: backend(1), 3: backend(3, 1), 2: backend(2, 3, 1)}
	got := Chain(2, backends)
	want := "1@1 waiting=false; 3@1 waiting=true wait=1.5; "
	s := ""
	for _, b := range got {
		s += fmt.Sprintf("%d@%d waiting=%v", b.PID, b.Depth, b.Waiting)
		if b.Waiting {
			s += fmt.Sprintf(" wait=%v", b.WaitSeconds)
		}
		s += "; "
	}
	if s != want {
		t.Errorf("chain %q, want %q", s, want)
	}
}

// Of a long queue, the holder is always listed and at most
// MaxQueuedListed of the waiters ahead.
func TestChainBoundsTheQueue(t *testing.T) {
	backends := map[int32]*Backend{1: backend(1)}
	last := int32(100)
	var ahead []int32
	for p := int32(2); p < last; p++ {
		backends[p] = backend(p, 1)
		ahead = append(ahead, p)
	}
	backends[last] = backend(last, append([]int32{1}, ahead...)...)
	got := Chain(last, backends)
	if len(got) != MaxQueuedListed+1 || got[0].PID != 1 || got[0].Waiting {
		t.Fatalf("%d listed (first %+v), want the holder and %d queued", len(got), got[0], MaxQueuedListed)
	}
}

func TestParseDeadlockDetail(t *testing.T) {
	detail := "Process 901 waits for ShareLock on transaction 1234; blocked by process 902.\n" +
		"Process 902 waits for ExclusiveLock on advisory lock [5,0,7,1]; blocked by process 901."
	got := ParseDeadlockDetail(detail)
	want := []DeadlockEdge{{PID: 901, By: 902, Mode: "ShareLock", Target: "transaction 1234"},
		{PID: 902, By: 901, Mode: "ExclusiveLock", Target: "advisory lock [5,0,7,1]"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("edges %v, want %v", got, want)
	}
	q := DeadlockFactsQuery(got, "tuple (0,1) of relation 16384 of database 5")
	if !strings.Contains(q, "a.pid IN (901,902)") || !strings.Contains(q, "c.oid IN (0,16384)") {
		t.Errorf("the facts' read does not ask for the cycle's backends and relations:\n%s", q)
	}
}

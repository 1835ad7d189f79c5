package holders

import (
	"strings"
	"testing"
	"time"
)

// A blockage names the holder at the root first, the waiters queued ahead
// after it, and counts those the server's read did not list.
func TestBlockageNamesTheRootFirst(t *testing.T) {
	b := &Blockage{At: time.Now(), Queued: 3}
	ours := func(s Blocker) (Holder, bool) {
		if s.PID != 10 {
			return Holder{}, false
		}
		return Holder{Database: "orders", Conn: 2, PID: 10, Depth: s.Depth}, true
	}
	b.Add([]Blocker{
		{PID: 20, Depth: 1, Waiting: true, State: "active", XactSeconds: 1},
		{PID: 10, Depth: 2, State: "idle in transaction", XactSeconds: 5},
	}, ours)
	if h, ok := b.Root(); !ok || h.PID != 10 {
		t.Fatalf("root %+v (%v); want the holder, pid 10", h, ok)
	}
	if pid, ok := b.RootPID(); !ok || pid != 10 {
		t.Fatalf("root pid %d (%v), want 10", pid, ok)
	}
	s := b.String()
	if !strings.HasPrefix(s, "connection #2 of \"orders\"") || !strings.Contains(s, "queued ahead of this wait, waiting too: backend pid 20") ||
		!strings.Contains(s, "and 2 more queued ahead (not listed)") {
		t.Errorf("blockage %q", s)
	}
	if (&Blockage{}).String() != "unknown" || !(*Blockage)(nil).Empty() {
		t.Error("an empty blockage is not unknown")
	}
}

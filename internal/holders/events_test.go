package holders

import (
	"fmt"
	"testing"
)

// The ring keeps the last events, oldest first, and counts them all.
func TestEventsKeepTheLast(t *testing.T) {
	r := NewEvents(3)
	for i := range 5 {
		r.Add("retry", fmt.Sprint(i))
	}
	r.Count("lock_timeouts", 2)
	var nilRing *Events
	nilRing.Add("retry", "dropped")
	events, counts := r.Snapshot()
	got := ""
	for _, e := range events {
		got += e.Message
	}
	if got != "234" || counts["retry"] != 5 || counts["lock_timeouts"] != 2 {
		t.Fatalf("events %q, counts %v; want 234, retry 5, lock_timeouts 2", got, counts)
	}
}

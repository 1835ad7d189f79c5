package holders

import (
	"sync"
	"time"
)

// Events keeps the last events of one database and counts every event and
// counter by kind since the database was opened. It is written on rare
// paths only (losses, reroutes, refusals, failures), never on a lock's
// fast path. A nil *Events records nothing.
type Events struct {
	mu     sync.Mutex
	buf    []Event // len ≤ capacity; next is the oldest once full
	next   int
	cap    int
	counts map[string]int64
}

// NewEvents returns a ring that keeps the last capacity events.
func NewEvents(capacity int) *Events {
	return &Events{cap: capacity, counts: make(map[string]int64)}
}

// Add records an event of kind.
func (r *Events) Add(kind, message string) {
	if r == nil {
		return
	}
	e := Event{Time: time.Now(), Kind: kind, Message: message}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[kind]++
	if len(r.buf) < r.cap {
		r.buf = append(r.buf, e)
		return
	}
	r.buf[r.next] = e
	r.next = (r.next + 1) % r.cap
}

// Count adds n to the counter name, without an event.
func (r *Events) Count(name string, n int64) {
	if r == nil || n == 0 {
		return
	}
	r.mu.Lock()
	r.counts[name] += n
	r.mu.Unlock()
}

// Snapshot returns the events, oldest first, and the counts (none for a
// nil ring).
func (r *Events) Snapshot() ([]Event, map[string]int64) {
	if r == nil {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	events := make([]Event, 0, len(r.buf))
	events = append(events, r.buf[r.next:]...)
	events = append(events, r.buf[:r.next]...)
	counts := make(map[string]int64, len(r.counts))
	for k, v := range r.counts {
		counts[k] = v
	}
	return events, counts
}

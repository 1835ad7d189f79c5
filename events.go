package lockhooks

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// Kinds of the events kept for the debug page ([DebugHandler]).
const (
	eventLockLost       = "lock_lost"       // a connection holding session locks died
	eventUnlockRerouted = "unlock_rerouted" // an unlock ran on the parked holder
	eventUnlockRefused  = "unlock_refused"  // an unlock refused with ErrNotLockOwner
	eventDeadlock       = "deadlock"        // a statement failed with 40P01
	eventRetry          = "retry"           // a transaction was retried (RunInTx)
	eventLockOrder      = "lock_order"      // a lock-order report (WithLockOrderCheck)
	eventLongHold       = "long_hold"       // a parked lock held past the warning threshold
	eventSlowWait       = "slow_wait"       // a lock wait longer than WithSlowLockLog's threshold
	eventWriterTimeout  = "writer_timeout"  // an SQLite writer gave up waiting for the writer lock
	eventSelfWait       = "self_wait"       // a wait for its own call chain's transaction, failed with ErrSelfWait
	eventPoolDeadlock   = "pool_deadlock"   // a lock statement gave its connection up: the pool would have deadlocked (ErrPoolDeadlock)
)

// Counters kept without an event each: frequent, expected outcomes.
const (
	countLockTimeout   = "lock_timeouts"          // 55P03: lock_timeout or NOWAIT
	countSerialization = "serialization_failures" // 40001
)

// eventCapacity bounds the events one database keeps.
const eventCapacity = 256

// eventRing keeps the last events of one database and counts every event
// and counter by kind since the database was opened. It is written on
// rare paths only (losses, reroutes, refusals, failures), never on a
// lock's fast path.
type eventRing struct {
	mu     sync.Mutex
	buf    []holders.Event // len ≤ capacity; next is the oldest once full
	next   int
	cap    int
	counts map[string]int64
}

func newEventRing(capacity int) *eventRing {
	return &eventRing{cap: capacity, counts: make(map[string]int64)}
}

// add records an event of kind. A nil ring records nothing.
func (r *eventRing) add(kind, message string) {
	if r == nil {
		return
	}
	e := holders.Event{Time: time.Now(), Kind: kind, Message: message}
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

// count adds n to the counter name, without an event.
func (r *eventRing) count(name string, n int64) {
	if r == nil || n == 0 {
		return
	}
	r.mu.Lock()
	r.counts[name] += n
	r.mu.Unlock()
}

// snapshot returns the events, oldest first, and the counts.
func (r *eventRing) snapshot() ([]holders.Event, map[string]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	events := make([]holders.Event, 0, len(r.buf))
	events = append(events, r.buf[r.next:]...)
	events = append(events, r.buf[:r.next]...)
	counts := make(map[string]int64, len(r.counts))
	for k, v := range r.counts {
		counts[k] = v
	}
	return events, counts
}

// noteRetry puts a RunInTx retry among the database's recent events (the
// /debug/locks page). Retries are rare; finding the database's state takes
// a connection from the pool for a moment.
func noteRetry(ctx context.Context, db *sql.DB, attempt int, err error) {
	sc, c, cerr := lockhooksConn(ctx, db)
	if cerr != nil {
		return
	}
	defer sc.Close()
	c.connector.events.add(eventRetry, fmt.Sprintf("RunInTx attempt %d failed and is retried: %v", attempt, err))
}

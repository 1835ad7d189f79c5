package lockhooks

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/pgstmt"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// Kinds of the events kept for the debug page ([DebugHandler]).
const (
	eventLockLost       = "lock_lost"               // a connection holding session locks died
	eventUnlockRerouted = "unlock_rerouted"         // an unlock ran on the parked holder
	eventUnlockRefused  = pgstmt.EventUnlockRefused // an unlock refused with ErrNotLockOwner
	eventDeadlock       = "deadlock"                // a statement failed with 40P01
	eventRetry          = "retry"                   // a transaction was retried (RunInTx)
	eventLockOrder      = "lock_order"              // a lock-order report (WithLockOrderCheck)
	eventLongHold       = "long_hold"               // a parked lock held past the warning threshold
	eventSlowWait       = waits.EventSlowWait       // a lock wait longer than WithSlowLockLog's threshold
	eventWriterTimeout  = "writer_timeout"          // an SQLite writer gave up waiting for the writer lock
	eventSelfWait       = pgstmt.EventSelfWait      // a wait for its own call chain's transaction, failed with ErrSelfWait
	eventPoolDeadlock   = "pool_deadlock"           // a lock statement gave its connection up: the pool would have deadlocked (ErrPoolDeadlock)
)

// Counters kept without an event each: frequent, expected outcomes.
const (
	countLockTimeout   = "lock_timeouts"          // 55P03: lock_timeout or NOWAIT
	countSerialization = "serialization_failures" // 40001
)

// eventCapacity bounds the events one database keeps.
const eventCapacity = 256

// noteRetry puts a RunInTx retry among the database's recent events (the
// /debug/locks page). Retries are rare; finding the database's state takes
// a connection from the pool for a moment.
func noteRetry(ctx context.Context, db *sql.DB, attempt int, err error) {
	sc, c, cerr := lockhooksConn(ctx, db)
	if cerr != nil {
		return
	}
	defer sc.Close()
	c.connector.Events.Add(eventRetry, fmt.Sprintf("RunInTx attempt %d failed and is retried: %v", attempt, err))
}

package lockhooks

import (
	"time"

	"github.com/lockhooks/lockhooks/internal/waits"
)

// defaultSlowLockLog is WithSlowLockLog's default threshold.
const defaultSlowLockLog = 2 * time.Second

// blockerLookupTimeout bounds the reads of pg_blocking_pids made for the
// slow-wait log and the debug page.
const blockerLookupTimeout = waits.LookupTimeout

// WithSlowLockLog logs, through the logger of [WithLogger], every lock wait
// that lasts longer than d: once while it is still waiting (what it waits
// for, how long so far, and who holds it: the call site and age of the
// holder in this process, or the Postgres backends that block it, read
// from pg_blocking_pids and pg_stat_activity on a side connection), and
// once when it ends, with its outcome. It is the lock-wait visibility of a
// service without OpenTelemetry. The default is 2s; 0 turns it off. Waits
// shorter than d cost no allocation and no timer of their own: one
// goroutine per database watches the waits in progress.
func WithSlowLockLog(d time.Duration) Option {
	return func(o *options) { o.slowLockLog = d }
}

// waitWatch is a database's waits in progress (internal/waits), for the
// debug page and the slow-wait log; waitView is one of them, copied.
type (
	waitWatch = waits.Watch[*conn, lockKey]
	waitView  = waits.View[*conn, lockKey]
)

// newWaitWatch returns the waits in progress of c's database, whose
// holders c finds.
func newWaitWatch(c *connector) *waitWatch {
	return waits.New(waits.Config[*conn, lockKey]{Threshold: c.opts.slowLockLog, Logger: c.opts.logger,
		LookUpBeforeDeadline: c.opts.dialect == Postgres, HoldersOf: c.HoldersOf, Events: c.Events,
		Telemetry: c.tel.Set, Outcomes: outcomes(), SelfWait: ErrSelfWait})
}

// AppendWaitArgs appends what the slow-wait log says of c as a waiter: its
// database, number and backend pid (waits.Waiter).
func (c *conn) AppendWaitArgs(args []any) []any {
	args = append(args, "database", c.connector.Pool, "connection", c.id)
	if pid := c.shownPID(); pid != 0 {
		args = append(args, "backend_pid", pid)
	}
	return args
}

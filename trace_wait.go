package lockhooks

// Lock waits as spans, the root's part: what a wait is (a waits.Lock: its
// span, its outcome, the holders named once it passes the blocker
// threshold, the orphan span of a wait whose context ended first) and how
// its outcome is classified, with the root's sentinels. A statement's
// waits are started and ended by internal/pgstmt.

import (
	"github.com/lockhooks/lockhooks/internal/telemetry"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// lockWait is one lock acquisition in progress (waits.Lock): its span and
// histogram, the lookup of its blockers, its self-wait probe, and what the
// debug page and the slow-wait log know of it. One allocation per wait.
type lockWait = waits.Lock[*conn, lockKey]

// outcomes classifies the errors of lock acquisitions: lockhooks' own
// sentinels of a lost lock and of a writer-lock timeout among them.
func outcomes() telemetry.Outcomes {
	return telemetry.Outcomes{Lost: ErrLockLost, Timeout: ErrWriterLockTimeout}
}

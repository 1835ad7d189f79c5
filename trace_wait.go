package lockhooks

// Lock waits as spans, the root's part: the waits of a Postgres statement's
// advisory calls and row-locking clause, started from what the scanner
// found in it, with the holders this process knows of named at once, and
// their end. A wait from start to end (its span, its outcome, the holders
// named once it passes the blocker threshold, the orphan span of a wait
// whose context ended first) is a waits.Lock.

import (
	"github.com/lockhooks/lockhooks/internal/telemetry"
	"github.com/lockhooks/lockhooks/internal/waits"
)

// lockWait is one lock acquisition in progress (waits.Lock): its span and
// histogram, the lookup of its blockers, its self-wait probe, and what the
// debug page and the slow-wait log know of it. One allocation per wait.
type lockWait = waits.Lock[*conn, lockKey]

// outcomeOf classifies the error of a lock acquisition.
func outcomeOf(err error) string { return outcomes().Of(err) }

// outcomes classifies the errors of lock acquisitions: lockhooks' own
// sentinels of a lost lock and of a writer-lock timeout among them.
func outcomes() telemetry.Outcomes {
	return telemetry.Outcomes{Lost: ErrLockLost, Timeout: ErrWriterLockTimeout}
}

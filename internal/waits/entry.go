package waits

import (
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// Waiter is who waits: the caller's connection (a pointer; its zero value
// means "not known").
type Waiter interface {
	comparable
	// AppendWaitArgs appends the slow-wait log's attributes that name the
	// waiting connection (its database, number, backend pid).
	AppendWaitArgs(args []any) []any
	// PID is the waiting connection's backend pid (0: none known).
	PID() int32
}

// Progress of a wait's slow-wait log.
const (
	slowNone      = iota
	slowReporting // the watcher is finding the holder and logging
	slowReported  // the "still waiting" line is out
)

// Entry is one lock wait in progress: its span and histogram
// (telemetry.Wait) and what the debug page and the slow-wait log know of
// it. A caller keeps it by value inside its own record of the wait, so
// tracking a wait allocates nothing of its own. Its fields are guarded by
// the mutex of the Watch that lists it; the getters without a Watch are
// for the waiting goroutine, which alone sets what they read.
type Entry[W Waiter, K any] struct {
	telemetry.Wait

	prev, next *Entry[W, K]
	listed     bool
	ended      bool // ended while its "still waiting" line was being written
	looked     bool // the lookup before the deadline ran (lookAt)

	waiter    W              // the waiting connection, when known
	site      string         // where the wait was asked for, or
	pcs       callsite.Stack // the stack, symbolised only when shown
	query     string         // the statement that waits (row locks, SQLite writes); never its arguments
	keys      string         // the keys or ids, as text
	namespace string         // Lock's namespace
	advKeys   []K            // Postgres advisory keys, for the in-process holder
	selfHint  string         // why the wait is likely a self-wait, or ""

	slow       int
	holderText string        // the holder as the "still waiting" line named it
	holderAt   time.Duration // how long the wait had lasted when it was named
	endOutcome string
	endWaited  time.Duration

	// lookAt is when, shortly before its context's deadline, a Postgres
	// wait looks up who holds what it waits for, so that the error of a
	// wait that times out can name the holder (the server forgets the
	// wait the moment the driver cancels it). Zero: no lookup.
	lookAt time.Time
	// found is who held what the wait waits for, as the slow-wait log, the
	// span's blockers read or the lookup found them first (named again,
	// with their ages now, by HolderNamed).
	found *holders.Blockage
}

// Waiter is the waiting connection, or W's zero value.
func (e *Entry[W, K]) Waiter() W { return e.waiter }

// Keys are the keys or ids waited for, as text.
func (e *Entry[W, K]) Keys() string { return e.keys }

// Namespace is the namespace of the lockset waited for, or "".
func (e *Entry[W, K]) Namespace() string { return e.namespace }

// Query is the statement that waits (row locks, SQLite writes), or "".
func (e *Entry[W, K]) Query() string { return e.query }

// AdvisoryKeys are the Postgres advisory keys waited for, where known.
func (e *Entry[W, K]) AdvisoryKeys() []K { return e.advKeys }

// View is a copy of one wait, taken under the Watch's mutex when the
// Watch lists it (a caller may also make one of what it knows of its own
// wait, to ask HoldersOf).
type View[W Waiter, K any] struct {
	Entry     *Entry[W, K] // the wait itself: use it only through the Watch's methods
	Kind      string       // "advisory", "row", "lockset", "sqlite_writer"
	Mode      string       // the lock's mode: "exclusive", "shared", "for_update", ...
	Scope     string       // "session" or "transaction"
	Start     time.Time    // when the wait began
	Waiter    W            // the waiting connection, or W's zero value
	Site      string       // where the wait was asked for, symbolised
	Query     string       // the statement that waits, or ""
	Keys      string       // the keys or ids, as text
	Namespace string       // Lock's namespace, or ""
	AdvKeys   []K          // the Postgres advisory keys waited for, where known
	SelfHint  string       // why the wait is likely a self-wait, or ""
	pcs       callsite.Stack
}

// viewLocked copies e; the Watch's mutex is held. The stack is symbolised
// later, by symbolise, outside the lock every wait takes.
func viewLocked[W Waiter, K any](e *Entry[W, K]) View[W, K] {
	return View[W, K]{Entry: e, Kind: e.Kind(), Mode: e.Mode(), Scope: e.Scope(), Start: e.Started(), Waiter: e.waiter,
		Site: e.site, Query: e.query, Keys: e.keys, Namespace: e.namespace, AdvKeys: e.advKeys, pcs: e.pcs, SelfHint: e.selfHint}
}

// symbolise fills Site from the stack; the Watch's mutex is not held.
func (v *View[W, K]) symbolise() {
	if v.Site == "" && v.pcs.Recorded() {
		v.Site = v.pcs.String()
	}
}

// what names the lock waited for.
func (v View[W, K]) what() string {
	switch {
	case v.Namespace != "":
		return fmt.Sprintf("%q ids %s", v.Namespace, v.Keys)
	case v.Keys != "":
		return v.Keys
	case v.Query != "":
		return fmt.Sprintf("for %.120q", v.Query)
	}
	return "(" + v.Mode + ")"
}

// logArgs are the attributes every slow-wait line carries.
func (v View[W, K]) logArgs() []any {
	args := []any{"kind", v.Kind, "mode", v.Mode, "scope", v.Scope}
	if v.Namespace != "" {
		args = append(args, "namespace", v.Namespace)
	}
	if v.Keys != "" {
		args = append(args, "keys", v.Keys)
	}
	if v.Query != "" {
		args = append(args, "statement", holders.Truncate(v.Query, 200))
	}
	var unknown W
	if v.Waiter != unknown {
		args = v.Waiter.AppendWaitArgs(args)
	}
	if v.Site != "" {
		args = append(args, "waiting_at", v.Site)
	}
	return args
}

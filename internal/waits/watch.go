package waits

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// EventSlowWait is the kind of the event a slow wait puts among its
// database's events: a lock wait longer than the slow-wait threshold.
const EventSlowWait = "slow_wait"

// LookupTimeout bounds each holder lookup the Watch asks for.
const LookupTimeout = 2 * time.Second

// lookupLead is how long before its context's deadline a Postgres wait
// looks up its holder: a quarter of the wait's budget, at most this.
const lookupLead = time.Second

// Config is what a Watch is made with. Logger and HoldersOf are needed
// once the watcher runs: with a Threshold, or LookUpBeforeDeadline.
type Config[W Waiter, K any] struct {
	// Threshold is the slow-wait log's: waits longer than it are logged;
	// 0 logs none.
	Threshold time.Duration
	// Logger receives the slow-wait lines.
	Logger *slog.Logger
	// LookUpBeforeDeadline: a wait whose context has a deadline looks up
	// its holder shortly before it (the caller's choice: lockhooks makes
	// it on Postgres, where the server forgets a cancelled wait).
	LookUpBeforeDeadline bool
	// HoldersOf finds who holds what a wait waits for, within ctx.
	HoldersOf func(ctx context.Context, v View[W, K]) *holders.Blockage
	// Events receives an EventSlowWait for each slow wait (nil: none).
	Events *holders.Events
	// Telemetry times the waits begun by Start, and records their spans;
	// Start needs it.
	Telemetry *telemetry.Set
	// Outcomes classifies the error of a wait that ended without an
	// outcome of its own (Lock.End).
	Outcomes telemetry.Outcomes
	// SelfWait is the sentinel of a certain self-wait, whose errors
	// Lock.WithSelfHint leaves alone (nil: none).
	SelfWait error
}

// Watch is the set of lock waits in progress of one database: an
// intrusive list (no allocation per wait) and one goroutine, started at
// the first wait it has to watch (a threshold is set, or the wait looks
// up its holder before its deadline), that sleeps until the oldest
// unreported wait reaches the threshold. A nil *Watch tracks nothing, and
// its methods are safe to call.
type Watch[W Waiter, K any] struct {
	cfg Config[W, K]

	mu         sync.Mutex
	head, tail *Entry[W, K]
	running    bool
	closed     bool
	wake       chan struct{} // buffered(1): a wait was added
	stop, done chan struct{}
	// lookups is the context of the holder lookups the watcher makes: Close
	// cancels it, so a server that stopped answering cannot hold Close for
	// a lookup timeout per listed wait.
	lookups    context.Context
	endLookups context.CancelFunc

	started atomic.Int64 // waits begun
	waitNS  atomic.Int64 // total time waited, in nanoseconds
}

// New returns an empty Watch; its goroutine starts at the first wait it
// has to watch.
func New[W Waiter, K any](cfg Config[W, K]) *Watch[W, K] {
	lookups, end := context.WithCancel(context.Background())
	return &Watch[W, K]{cfg: cfg, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		lookups: lookups, endLookups: end}
}

// Threshold is the slow-wait log's threshold.
func (ww *Watch[W, K]) Threshold() time.Duration {
	if ww == nil {
		return 0
	}
	return ww.cfg.Threshold
}

// Counts returns how many waits began and how long they waited in all.
func (ww *Watch[W, K]) Counts() (started int64, waited time.Duration) {
	if ww == nil {
		return 0, 0
	}
	return ww.started.Load(), time.Duration(ww.waitNS.Load())
}

// Add lists e, whose telemetry.Wait has started, reading its keys and
// namespace from the wait's span attributes and, where the Config says
// so, when to look up its holder from ctx's deadline.
func (ww *Watch[W, K]) Add(ctx context.Context, e *Entry[W, K], attrs []attribute.KeyValue) {
	if ww == nil {
		return
	}
	if deadline, ok := ctx.Deadline(); ok && ww.cfg.LookUpBeforeDeadline {
		e.lookAt = deadline.Add(-min(lookupLead, deadline.Sub(e.Started())/4))
	}
	ww.started.Add(1)
	for _, a := range attrs {
		switch a.Key {
		case telemetry.AttrLockKeys:
			e.keys = a.Value.AsString()
		case telemetry.AttrLockNamespace:
			e.namespace = a.Value.AsString()
		}
	}
	ww.mu.Lock()
	if ww.closed {
		ww.mu.Unlock()
		return
	}
	e.listed = true
	e.prev = ww.tail
	if ww.tail != nil {
		ww.tail.next = e
	} else {
		ww.head = e
	}
	ww.tail = e
	watched := ww.cfg.Threshold > 0 || !e.lookAt.IsZero()
	start := !ww.running && watched
	if start {
		ww.running = true
	}
	ww.mu.Unlock()
	if start {
		go ww.run()
	}
	if watched {
		select {
		case ww.wake <- struct{}{}:
		default:
		}
	}
}

// SetWaiter records who waits: the connection (always set, its zero value
// too), where (site, or the stack in pcs), the statement, and the
// Postgres advisory keys; an empty or nil one of these leaves its field
// alone.
func (ww *Watch[W, K]) SetWaiter(e *Entry[W, K], waiter W, site string, pcs *callsite.Stack, query string, keys []K) {
	if ww == nil {
		return
	}
	ww.mu.Lock()
	e.waiter = waiter
	if site != "" {
		e.site = site
	}
	if pcs != nil {
		e.pcs = *pcs
	}
	if query != "" {
		e.query = query
	}
	if keys != nil {
		e.advKeys = keys
	}
	ww.mu.Unlock()
}

// SetSelfHint records on e why its wait is likely a self-wait, for its
// slow-wait line and its timeout error. On a nil Watch it sets the hint
// alone.
func (ww *Watch[W, K]) SetSelfHint(e *Entry[W, K], hint string) {
	if ww != nil {
		ww.mu.Lock()
		defer ww.mu.Unlock()
	}
	e.selfHint = hint
}

// SelfHint is e's self-wait hint, or "".
func (ww *Watch[W, K]) SelfHint(e *Entry[W, K]) string {
	if ww != nil {
		ww.mu.Lock()
		defer ww.mu.Unlock()
	}
	return e.selfHint
}

// Remove unlists e as its wait ends, and writes the slow wait's last line.
func (ww *Watch[W, K]) Remove(e *Entry[W, K], outcome string) {
	if ww == nil {
		return
	}
	waited := time.Since(e.Started())
	ww.waitNS.Add(int64(waited))
	ww.mu.Lock()
	if !e.listed {
		ww.mu.Unlock()
		return
	}
	e.listed = false
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		ww.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		ww.tail = e.prev
	}
	e.prev, e.next = nil, nil
	state, holder, at := e.slow, e.holderText, e.holderAt
	if state == slowReporting {
		e.ended, e.endOutcome, e.endWaited = true, outcome, waited
	}
	ww.mu.Unlock()
	if state == slowReported {
		ww.logEnd(e, outcome, waited, holder, at)
	}
}

// Close stops the watcher and cancels its lookups; later waits are not
// listed.
func (ww *Watch[W, K]) Close() {
	if ww == nil {
		return
	}
	ww.mu.Lock()
	if ww.closed {
		ww.mu.Unlock()
		return
	}
	ww.closed = true
	running := ww.running
	ww.mu.Unlock()
	ww.endLookups()
	if running {
		close(ww.stop)
		<-ww.done
	}
}

// List returns the waits in progress, oldest first.
func (ww *Watch[W, K]) List() []View[W, K] {
	out, _ := ww.ListBounded(-1, nil)
	return out
}

// ListBounded returns the first n waits in progress (the oldest; n < 0:
// all) and how many there are in all. each, if not nil, is called with
// the advisory keys of every wait, under the Watch's mutex: it must be
// quick and take no other lock.
func (ww *Watch[W, K]) ListBounded(n int, each func(keys []K)) ([]View[W, K], int) {
	if ww == nil {
		return nil, 0
	}
	var out []View[W, K]
	total := 0
	ww.mu.Lock()
	for e := ww.head; e != nil; e = e.next {
		total++
		if n < 0 || len(out) < n {
			out = append(out, viewLocked(e))
		}
		if each != nil {
			each(e.advKeys)
		}
	}
	ww.mu.Unlock()
	for i := range out {
		out[i].symbolise()
	}
	return out, total
}

// run is the watcher: it sleeps until a wait is added, then until the
// next wait is due (the oldest unreported one reaches the threshold, or
// one reaches the time of its lookup before its deadline) or another is
// added, and reports and looks up the waits that are due.
func (ww *Watch[W, K]) run() {
	defer close(ww.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	threshold := ww.cfg.Threshold
	for {
		select {
		case <-ww.stop:
			return
		case <-ww.wake:
		}
		for {
			now := time.Now()
			next := time.Duration(-1)
			soon := func(left time.Duration) {
				if next < 0 || left < next {
					next = left
				}
			}
			var due, look []View[W, K]
			ww.mu.Lock()
			for e := ww.head; e != nil; e = e.next {
				if threshold > 0 && e.slow == slowNone {
					left := threshold - now.Sub(e.Started())
					if left <= 0 {
						e.slow = slowReporting
						due = append(due, viewLocked(e))
					} else {
						soon(left)
					}
				}
				if !e.lookAt.IsZero() && !e.looked && e.slow == slowNone {
					if left := e.lookAt.Sub(now); left <= 0 {
						e.looked = true
						look = append(look, viewLocked(e))
					} else {
						soon(left)
					}
				}
			}
			ww.mu.Unlock()
			for _, v := range due {
				ww.report(v)
			}
			for _, v := range look {
				if ww.lookups.Err() != nil {
					return // closing: the waits end with the database
				}
				ww.lookUp(v)
			}
			if next < 0 {
				break
			}
			timer.Reset(next)
			select {
			case <-ww.stop:
				timer.Stop()
				return
			case <-timer.C:
			case <-ww.wake:
				// A wait added meanwhile may be due sooner (a lookup before
				// a nearer deadline): look again.
				timer.Stop()
			}
		}
	}
}

// report writes the "still waiting" line of a slow wait, and its last
// line if the wait ended meanwhile.
func (ww *Watch[W, K]) report(v View[W, K]) {
	v.symbolise()
	ctx, cancel := context.WithTimeout(ww.lookups, LookupTimeout)
	found := ww.cfg.HoldersOf(ctx, v)
	cancel()
	holder := found.String()
	at := time.Since(v.Start).Round(time.Millisecond)
	args := append(append(v.logArgs(), "waited", at.String()), found.LogArgs()...)
	if v.SelfHint != "" {
		args = append(args, "self_wait", v.SelfHint)
		holder += " (" + v.SelfHint + ")"
	}
	ww.cfg.Logger.Warn("lockhooks: slow lock wait: still waiting", args...)
	ww.cfg.Events.Add(EventSlowWait, fmt.Sprintf("%s lock %s waited more than %v; held by %s", v.Kind, v.what(), ww.cfg.Threshold, holder))

	e := v.Entry
	ww.mu.Lock()
	e.slow, e.holderText, e.holderAt = slowReported, holder, at
	if !found.Empty() {
		e.found = found
	}
	ended, outcome, waited := e.ended, e.endOutcome, e.endWaited
	ww.mu.Unlock()
	if ended {
		ww.logEnd(e, outcome, waited, holder, at)
	}
}

// lookUp finds, shortly before the deadline of v's context, who holds
// what v waits for, for the error of a wait that times out.
func (ww *Watch[W, K]) lookUp(v View[W, K]) {
	v.symbolise()
	ctx, cancel := context.WithTimeout(ww.lookups, LookupTimeout)
	found := ww.cfg.HoldersOf(ctx, v) // a failed read leaves the error as it was
	cancel()
	ww.NoteFound(v.Entry, found)
}

// NoteFound keeps found as who holds what e waits for, unless someone
// found them first.
func (ww *Watch[W, K]) NoteFound(e *Entry[W, K], found *holders.Blockage) {
	if found.Empty() || ww == nil {
		return
	}
	ww.mu.Lock()
	if e.found == nil {
		e.found = found
	}
	ww.mu.Unlock()
}

// Found is who holds what e waits for, as first found, or nil.
func (ww *Watch[W, K]) Found(e *Entry[W, K]) *holders.Blockage {
	if ww == nil {
		return nil
	}
	ww.mu.Lock()
	defer ww.mu.Unlock()
	return e.found
}

// HolderNamed names the holder of what e waits for, as the slow-wait log,
// the span's blockers read or the lookup found it (with its ages now), or
// "".
func (ww *Watch[W, K]) HolderNamed(e *Entry[W, K]) string {
	found := ww.Found(e)
	if found.Empty() {
		return ""
	}
	return found.Aged().String()
}

// logEnd writes the last line of a slow wait. The holder is not read
// again (the wait is over); the line repeats it as the still-waiting line
// named it, and says when, so that its ages are not taken for the end's.
func (ww *Watch[W, K]) logEnd(e *Entry[W, K], outcome string, waited time.Duration, holder string, at time.Duration) {
	ww.mu.Lock()
	v := viewLocked(e)
	ww.mu.Unlock()
	v.symbolise()
	args := append(v.logArgs(), "waited", waited.Round(time.Millisecond).String(), "outcome", outcome,
		"holder", "as named "+at.String()+" into the wait: "+holder)
	ww.cfg.Logger.Warn("lockhooks: slow lock wait: ended", args...)
}

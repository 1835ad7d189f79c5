package lockhooks

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
)

// defaultSlowLockLog is WithSlowLockLog's default threshold.
const defaultSlowLockLog = 2 * time.Second

// blockerLookupTimeout bounds the reads of pg_blocking_pids made for the
// slow-wait log and the debug page.
const blockerLookupTimeout = 2 * time.Second

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

// Progress of a wait's slow-wait log.
const (
	slowNone      = iota
	slowReporting // the watcher is finding the holder and logging
	slowReported  // the "still waiting" line is out
)

// waitInfo is what the debug page and the slow-wait log know of a wait in
// progress, beyond its kind, mode and start. It lives inside lockWait, so
// tracking a wait allocates nothing; its fields are guarded by the
// database's waitWatch.mu.
type waitInfo struct {
	prev, next *lockWait
	listed     bool
	ended      bool // ended while its "still waiting" line was being written (next to listed: the record stays 416 bytes)

	conn      *conn          // the waiting connection, when known
	site      string         // where the wait was asked for, or
	pcs       callsite.Stack // the stack, symbolised only when shown
	query     string         // the statement that waits (row locks, SQLite writes); never its arguments
	keys      string         // the keys or ids, as text
	namespace string         // Lock's namespace
	advKeys   []lockKey      // Postgres advisory keys, for the in-process holder
	selfHint  string         // why the wait is likely a self-wait (selfwait.go), or ""

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
	looked bool
	// found is who held what the wait waits for, as the slow-wait log, the
	// span's blockers read or the lookup found them first (named again,
	// with their ages now, by holderNamed).
	found *holders.Blockage
}

// lookupLead is how long before its context's deadline a Postgres wait
// looks up its holder: a quarter of the wait's budget, at most this.
const lookupLead = time.Second

// waitWatch is the set of lock waits in progress of one database, for the
// debug page and the slow-wait log: an intrusive list (no allocation per
// wait) and one goroutine, started at the first wait, that sleeps until
// the oldest unreported wait reaches the threshold.
type waitWatch struct {
	c         *connector
	threshold time.Duration
	logger    *slog.Logger

	mu         sync.Mutex
	head, tail *lockWait
	running    bool
	closed     bool
	wake       chan struct{} // buffered(1): a wait was added
	stop, done chan struct{}
	// lookups is the context of the holder lookups the watcher makes: close
	// cancels it, so a server that stopped answering cannot hold db.Close
	// for a lookup timeout per listed wait.
	lookups    context.Context
	endLookups context.CancelFunc

	started atomic.Int64 // waits begun
	waitNS  atomic.Int64 // total time waited, in nanoseconds
}

func newWaitWatch(c *connector) *waitWatch {
	lookups, end := context.WithCancel(context.Background())
	return &waitWatch{c: c, threshold: c.opts.slowLockLog, logger: c.opts.logger,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		lookups: lookups, endLookups: end}
}

// add lists w, reading its keys and namespace from the wait's attributes
// and, on Postgres, when to look up its holder from ctx's deadline.
func (ww *waitWatch) add(ctx context.Context, w *lockWait, attrs []attribute.KeyValue) {
	if ww == nil {
		return
	}
	if deadline, ok := ctx.Deadline(); ok && ww.c != nil && ww.c.opts.dialect == Postgres {
		w.lookAt = deadline.Add(-min(lookupLead, deadline.Sub(w.Started())/4))
	}
	ww.started.Add(1)
	for _, a := range attrs {
		switch a.Key {
		case AttrLockKeys:
			w.waitInfo.keys = a.Value.AsString()
		case AttrLockNamespace:
			w.waitInfo.namespace = a.Value.AsString()
		}
	}
	ww.mu.Lock()
	if ww.closed {
		ww.mu.Unlock()
		return
	}
	w.listed = true
	w.prev = ww.tail
	if ww.tail != nil {
		ww.tail.next = w
	} else {
		ww.head = w
	}
	ww.tail = w
	watched := ww.threshold > 0 || !w.lookAt.IsZero()
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

// setWaiter records who waits: the connection, where (site, or the stack
// in pcs), the statement, and the Postgres advisory keys. Nil arguments
// leave the field alone.
func (w *lockWait) setWaiter(c *conn, site string, pcs *callsite.Stack, query string, keys []lockKey) {
	if w == nil || w.t == nil || w.t.watch == nil {
		return
	}
	ww := w.t.watch
	ww.mu.Lock()
	w.conn = c
	if site != "" {
		w.site = site
	}
	if pcs != nil {
		w.pcs = *pcs
	}
	if query != "" {
		w.query = query
	}
	if keys != nil {
		w.advKeys = keys
	}
	ww.mu.Unlock()
}

// remove unlists w as its wait ends, and writes the slow wait's last line.
func (ww *waitWatch) remove(w *lockWait, outcome string) {
	if ww == nil {
		return
	}
	waited := time.Since(w.Started())
	ww.waitNS.Add(int64(waited))
	ww.mu.Lock()
	if !w.listed {
		ww.mu.Unlock()
		return
	}
	w.listed = false
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		ww.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		ww.tail = w.prev
	}
	w.prev, w.next = nil, nil
	state, holder, at := w.slow, w.holderText, w.holderAt
	if state == slowReporting {
		w.ended, w.endOutcome, w.endWaited = true, outcome, waited
	}
	ww.mu.Unlock()
	if state == slowReported {
		ww.logEnd(w, outcome, waited, holder, at)
	}
}

// close stops the watcher; later waits are not listed.
func (ww *waitWatch) close() {
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

// waitView is a copy of one listed wait, taken under waitWatch.mu.
type waitView struct {
	w         *lockWait
	kind      string
	mode      string
	scope     string
	start     time.Time
	conn      *conn
	site      string
	query     string
	keys      string
	namespace string
	advKeys   []lockKey
	pcs       callsite.Stack
	selfHint  string
}

// viewLocked copies w; ww.mu is held. The stack is symbolised later, by
// symbolise, outside the lock every wait takes.
func viewLocked(w *lockWait) waitView {
	return waitView{w: w, kind: w.Kind(), mode: w.Mode(), scope: w.Scope(), start: w.Started(), conn: w.conn,
		site: w.site, query: w.query, keys: w.keys, namespace: w.namespace, advKeys: w.advKeys, pcs: w.pcs, selfHint: w.selfHint}
}

// symbolise fills site from the stack; ww.mu is not held.
func (v *waitView) symbolise() {
	if v.site == "" && v.pcs.Recorded() {
		v.site = v.pcs.String()
	}
}

// list returns the waits in progress, oldest first.
func (ww *waitWatch) list() []waitView {
	if ww == nil {
		return nil
	}
	ww.mu.Lock()
	var out []waitView
	for w := ww.head; w != nil; w = w.next {
		out = append(out, viewLocked(w))
	}
	ww.mu.Unlock()
	for i := range out {
		out[i].symbolise()
	}
	return out
}

// run is the watcher: it sleeps until a wait is added, then until the
// oldest unreported wait reaches the threshold, and reports the waits
// that did.
func (ww *waitWatch) run() {
	defer close(ww.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
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
			var due, look []waitView
			ww.mu.Lock()
			for w := ww.head; w != nil; w = w.next {
				if ww.threshold > 0 && w.slow == slowNone {
					left := ww.threshold - now.Sub(w.Started())
					if left <= 0 {
						w.slow = slowReporting
						due = append(due, viewLocked(w))
					} else {
						soon(left)
					}
				}
				if !w.lookAt.IsZero() && !w.looked && w.slow == slowNone {
					if left := w.lookAt.Sub(now); left <= 0 {
						w.looked = true
						look = append(look, viewLocked(w))
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
			}
		}
	}
}

// report writes the "still waiting" line of a slow wait, and its last
// line if the wait ended meanwhile.
func (ww *waitWatch) report(v waitView) {
	v.symbolise()
	ctx, cancel := context.WithTimeout(ww.lookups, blockerLookupTimeout)
	found := ww.c.holdersOf(ctx, v)
	cancel()
	holder := found.String()
	at := time.Since(v.start).Round(time.Millisecond)
	args := append(append(v.logArgs(), "waited", at.String()), found.LogArgs()...)
	if v.selfHint != "" {
		args = append(args, "self_wait", v.selfHint)
		holder += " (" + v.selfHint + ")"
	}
	ww.logger.Warn("lockhooks: slow lock wait: still waiting", args...)
	ww.c.events.Add(eventSlowWait, fmt.Sprintf("%s lock %s waited more than %v; held by %s", v.kind, v.what(), ww.threshold, holder))

	ww.mu.Lock()
	v.w.slow, v.w.holderText, v.w.holderAt = slowReported, holder, at
	if !found.Empty() {
		v.w.found = found
	}
	ended, outcome, waited := v.w.ended, v.w.endOutcome, v.w.endWaited
	ww.mu.Unlock()
	if ended {
		ww.logEnd(v.w, outcome, waited, holder, at)
	}
}

// lookUp finds, shortly before the deadline of v's context, who holds
// what v waits for, for the error of a wait that times out.
func (ww *waitWatch) lookUp(v waitView) {
	v.symbolise()
	ctx, cancel := context.WithTimeout(ww.lookups, blockerLookupTimeout)
	found := ww.c.holdersOf(ctx, v) // a failed read leaves the error as it was
	cancel()
	v.w.noteFound(found)
}

// noteFound keeps found as who holds what w waits for, unless someone
// found them first.
func (w *lockWait) noteFound(found *holders.Blockage) {
	if found.Empty() || w == nil || w.t == nil || w.t.watch == nil {
		return
	}
	w.t.watch.mu.Lock()
	if w.found == nil {
		w.found = found
	}
	w.t.watch.mu.Unlock()
}

// holderNamed names the holder of what w waits for, as the slow-wait log,
// the span's blockers read or the lookup found it (with its ages now), or
// "".
func (w *lockWait) holderNamed() string {
	if w == nil || w.t == nil || w.t.watch == nil {
		return ""
	}
	w.t.watch.mu.Lock()
	found := w.found
	w.t.watch.mu.Unlock()
	if found.Empty() {
		return ""
	}
	return found.Aged().String()
}

// logEnd writes the last line of a slow wait. The holder is not read
// again (the wait is over); the line repeats it as the still-waiting line
// named it, and says when, so that its ages are not taken for the end's.
func (ww *waitWatch) logEnd(w *lockWait, outcome string, waited time.Duration, holder string, at time.Duration) {
	ww.mu.Lock()
	v := viewLocked(w)
	ww.mu.Unlock()
	v.symbolise()
	args := append(v.logArgs(), "waited", waited.Round(time.Millisecond).String(), "outcome", outcome,
		"holder", "as named "+at.String()+" into the wait: "+holder)
	ww.logger.Warn("lockhooks: slow lock wait: ended", args...)
}

// what names the lock waited for.
func (v waitView) what() string {
	switch {
	case v.namespace != "":
		return fmt.Sprintf("%q ids %s", v.namespace, v.keys)
	case v.keys != "":
		return v.keys
	case v.query != "":
		return fmt.Sprintf("for %.120q", v.query)
	}
	return "(" + v.mode + ")"
}

// logArgs are the attributes every slow-wait line carries.
func (v waitView) logArgs() []any {
	args := []any{"kind", v.kind, "mode", v.mode, "scope", v.scope}
	if v.namespace != "" {
		args = append(args, "namespace", v.namespace)
	}
	if v.keys != "" {
		args = append(args, "keys", v.keys)
	}
	if v.query != "" {
		args = append(args, "statement", holders.Truncate(v.query, 200))
	}
	if v.conn != nil {
		args = append(args, "database", v.conn.connector.pool, "connection", v.conn.id)
		if pid := v.conn.shownPID(); pid != 0 {
			args = append(args, "backend_pid", pid)
		}
	}
	if v.site != "" {
		args = append(args, "waiting_at", v.site)
	}
	return args
}

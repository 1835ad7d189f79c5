package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
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

	conn      *conn     // the waiting connection, when known
	site      string    // where the wait was asked for, or
	pcs       callers   // the stack, symbolised only when shown
	query     string    // the statement that waits (row locks, SQLite writes); never its arguments
	keys      string    // the keys or ids, as text
	namespace string    // Lock's namespace
	advKeys   []lockKey // Postgres advisory keys, for the in-process holder
	selfHint  string    // why the wait is likely a self-wait (selfwait.go), or ""

	slow       int
	holderText string        // the holder as the "still waiting" line named it
	holderAt   time.Duration // how long the wait had lasted when it was named
	ended      bool          // ended while its "still waiting" line was being written
	endOutcome string
	endWaited  time.Duration

	// lookAt is when, shortly before its context's deadline, a Postgres
	// wait looks up who holds what it waits for, so that the error of a
	// wait that times out can name the holder (the server forgets the
	// wait the moment the driver cancels it). Zero: no lookup.
	lookAt time.Time
	looked bool
	// found is who held what the wait waits for, as the slow-wait log or
	// the lookup found them (named again, with their ages then, by
	// holderNamed).
	found         []holder
	foundBlockers []pgBlocker
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

	started atomic.Int64 // waits begun
	waitNS  atomic.Int64 // total time waited, in nanoseconds
}

func newWaitWatch(c *connector) *waitWatch {
	return &waitWatch{c: c, threshold: c.opts.slowLockLog, logger: c.opts.logger,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// add lists w, reading its keys and namespace from the wait's attributes
// and, on Postgres, when to look up its holder from ctx's deadline.
func (ww *waitWatch) add(ctx context.Context, w *lockWait, attrs []attribute.KeyValue) {
	if ww == nil {
		return
	}
	if deadline, ok := ctx.Deadline(); ok && ww.c != nil && ww.c.opts.dialect == Postgres {
		w.lookAt = deadline.Add(-min(lookupLead, deadline.Sub(w.start)/4))
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
func (w *lockWait) setWaiter(c *conn, site string, pcs *callers, query string, keys []lockKey) {
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
	waited := time.Since(w.start)
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
	pcs       callers
	selfHint  string
}

// viewLocked copies w; ww.mu is held. The stack is symbolised later, by
// symbolise, outside the lock every wait takes.
func viewLocked(w *lockWait) waitView {
	return waitView{w: w, kind: w.kind, mode: w.mode, scope: w.scope, start: w.start, conn: w.conn,
		site: w.site, query: w.query, keys: w.keys, namespace: w.namespace, advKeys: w.advKeys, pcs: w.pcs, selfHint: w.selfHint}
}

// symbolise fills site from the stack; ww.mu is not held.
func (v *waitView) symbolise() {
	if v.site == "" && v.pcs.n > 0 {
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
					left := ww.threshold - now.Sub(w.start)
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
	ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
	holders, blockers, err := ww.c.holdersOf(ctx, v)
	cancel()
	holder := describeHolders(holders, blockers, err)
	at := time.Since(v.start).Round(time.Millisecond)
	args := append(v.logArgs(), "waited", at.String())
	if len(holders) > 0 {
		args = append(args, holders[0].logArgs()...)
		if len(holders) > 1 || len(blockers) > 0 {
			args = append(args, "holders", holder)
		}
	} else {
		args = append(args, "holder", holder)
	}
	if len(blockers) > 0 {
		pids := make([]string, len(blockers))
		for i, b := range blockers {
			pids[i] = strconv.Itoa(int(b.PID))
		}
		args = append(args, "blocking_pids", strings.Join(pids, ","))
	}
	if v.selfHint != "" {
		args = append(args, "self_wait", v.selfHint)
		holder += " (" + v.selfHint + ")"
	}
	ww.logger.Warn("lockhooks: slow lock wait: still waiting", args...)
	ww.c.events.add(eventSlowWait, fmt.Sprintf("%s lock %s waited more than %v; held by %s", v.kind, v.what(), ww.threshold, holder))

	ww.mu.Lock()
	v.w.slow, v.w.holderText, v.w.holderAt = slowReported, holder, at
	if len(holders)+len(blockers) > 0 {
		v.w.found, v.w.foundBlockers = holders, blockers
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
	ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
	holders, blockers, _ := ww.c.holdersOf(ctx, v) // a failed read leaves the error as it was
	cancel()
	if len(holders) == 0 && len(blockers) == 0 {
		return
	}
	ww.mu.Lock()
	if len(v.w.found)+len(v.w.foundBlockers) == 0 {
		v.w.found, v.w.foundBlockers = holders, blockers
	}
	ww.mu.Unlock()
}

// holderNamed names the holder of what w waits for, as the slow-wait log
// or the lookup before the deadline found it (with its age now), or "".
func (w *lockWait) holderNamed() string {
	if w == nil || w.t == nil || w.t.watch == nil {
		return ""
	}
	w.t.watch.mu.Lock()
	holders, blockers := w.found, w.foundBlockers
	w.t.watch.mu.Unlock()
	if len(holders)+len(blockers) == 0 {
		return ""
	}
	return describeHolders(holders, blockers, nil)
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
		args = append(args, "statement", truncate(v.query, 200))
	}
	if v.conn != nil {
		args = append(args, "database", v.conn.connector.pool, "connection", v.conn.id)
		if pid := v.conn.pid.Load(); pid != 0 {
			args = append(args, "backend_pid", pid)
		}
	}
	if v.site != "" {
		args = append(args, "waiting_at", v.site)
	}
	return args
}

// truncate shortens s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// pgBlocker is a Postgres backend that blocks one of the database's
// connections, as pg_blocking_pids and pg_stat_activity show it.
type pgBlocker struct {
	PID             int32   `json:"pid"`
	ApplicationName string  `json:"application_name"`
	State           string  `json:"state"`
	XactSeconds     float64 `json:"xact_age_seconds"` // -1: no transaction
	Query           string  `json:"query"`            // the statement text; never its arguments
	Conn            uint64  `json:"conn,omitempty"`   // the connection of this database it is, if any
}

// blockedBackend is what Postgres says of one backend that waits.
type blockedBackend struct {
	waitEvent   string // wait_event_type/wait_event
	query       string
	waitSeconds float64 // how long its statement has run (it waits in it); -1: unknown
	blockers    []pgBlocker
}

// blockersOf reads, on a side connection of its own (never a pool's), which
// backends block each of pids: pid, application_name, state, transaction
// age and statement of each. Backends that wait for nothing are absent.
func (c *connector) blockersOf(ctx context.Context, pids []int32) (map[int32]*blockedBackend, error) {
	if len(pids) == 0 {
		return nil, nil
	}
	list := make([]string, len(pids))
	for i, p := range pids {
		list[i] = strconv.Itoa(int(p))
	}
	side, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("lockhooks: connecting to read pg_blocking_pids: %w", err)
	}
	defer side.Close()
	rows, err := queryDirect(ctx, side, `SELECT w.pid::bigint, coalesce(wa.wait_event_type || '/' || wa.wait_event, ''), left(coalesce(wa.query, ''), 500),
	b.pid::bigint, coalesce(b.application_name, ''), coalesce(b.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - b.xact_start)::float8, -1), left(coalesce(b.query, ''), 500),
	coalesce(extract(epoch FROM clock_timestamp() - wa.query_start)::float8, -1)
FROM unnest('{`+strings.Join(list, ",")+`}'::int[]) AS w(pid)
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS bp(pid)
JOIN pg_stat_activity b ON b.pid = bp.pid
LEFT JOIN pg_stat_activity wa ON wa.pid = w.pid
ORDER BY 1, 4`, nil)
	if err != nil {
		return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
	}
	defer rows.Close()
	ours := map[int32]uint64{}
	for _, oc := range c.openConns() {
		if p := oc.pid.Load(); p != 0 {
			ours[p] = oc.id
		}
	}
	out := map[int32]*blockedBackend{}
	dest := make([]driver.Value, 9)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return nil, fmt.Errorf("lockhooks: reading pg_blocking_pids: %w", err)
		}
		w := int32(asInt64(dest[0]))
		bb := out[w]
		if bb == nil {
			bb = &blockedBackend{waitEvent: asString(dest[1]), query: asString(dest[2]), waitSeconds: asFloat64(dest[8])}
			out[w] = bb
		}
		b := pgBlocker{PID: int32(asInt64(dest[3])), ApplicationName: asString(dest[4]), State: asString(dest[5]),
			XactSeconds: asFloat64(dest[6]), Query: asString(dest[7])}
		b.Conn = ours[b.PID]
		bb.blockers = append(bb.blockers, b)
	}
}

// asFloat64 converts the float values drivers return.
func asFloat64(v driver.Value) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case float32:
		return float64(x)
	case int64:
		return float64(x)
	case []byte:
		f, _ := strconv.ParseFloat(string(x), 64)
		return f
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return 0
}

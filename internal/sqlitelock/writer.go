package sqlitelock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// Writer is the in-process lock that serialises SQLite writers of one
// database: FIFO, honouring ctx, bounded by a timeout. Taking it
// uncontended allocates nothing. Its zero value is free.
//
// Waiters are told who holds it: the autocommit statement, or where the
// holding transaction began. Finding that call site is a stack walk of a
// microsecond or two, a fifth of an in-memory write transaction, for a
// message that prints only when writers wait for each other, so a
// transaction that takes the lock uncontended records its site only while
// writers have waited within the last siteWindow (or where a stack capture
// is cheap, callsite.FastCapture). A writer that then waits for a
// transaction whose site was not recorded asks for it, and the holder
// records the site of its next statement (see NoteStatementInTx).
type Writer[T Taker] struct {
	mu       sync.Mutex
	held     bool
	owner    any
	since    time.Time
	stmt     string         // the autocommit statement holding it, or
	site     callsite.Stack // where the transaction holding it began (empty: not recorded)
	siteLate bool           // site is that of a later statement of the transaction
	taker    T              // the holder, as the caller described it
	waiters  []*WriterTicket[T]

	// contended is when a writer last had to wait.
	contended time.Time
	// siteWanted asks the holding transaction for its call site.
	siteWanted atomic.Bool
}

// siteWindow is how long after writers last waited for each other an
// uncontended transaction still records where it began.
const siteWindow = time.Minute

// WriterTicket is one writer's place in the queue of the writer lock.
type WriterTicket[T Taker] struct {
	owner   any
	since   time.Time // when it began waiting
	granted chan struct{}
	stmt    string
	site    callsite.Stack
	taker   T
	hint    string // why the wait is likely a self-wait, or ""
}

// Hint says why the queued wait is likely a self-wait, or is "".
func (tk *WriterTicket[T]) Hint() string { return tk.hint }

// Since returns when the queued writer began waiting.
func (tk *WriterTicket[T]) Since() time.Time { return tk.since }

// Site returns where the queued transaction begins (empty for a
// statement); it does not change while the ticket waits.
func (tk *WriterTicket[T]) Site() *callsite.Stack { return &tk.site }

// WriterHolder describes the holder of the writer lock.
type WriterHolder[T Taker] struct {
	Owner    any
	Since    time.Time
	Stmt     string         // the autocommit statement holding it, or
	Site     callsite.Stack // where its transaction began (empty: not recorded)
	SiteLate bool           // Site is that of a later statement of the transaction
	Taker    T
}

// ErrTimeout is returned by Writer.Wait when the wait outlasted its
// timeout.
var ErrTimeout = errors.New("sqlitelock: timed out waiting for the writer lock")

// TryTake takes the writer lock for owner (described by *taker, which it
// copies) if it is free, and reports whether it did: Take without a wait,
// and without copying a holder. stmt is as for Take.
func (w *Writer[T]) TryTake(owner any, taker *T, stmt string) bool {
	w.mu.Lock()
	if w.held {
		w.mu.Unlock()
		return false
	}
	// takeLocked, by hand: one frame less for the capture to walk.
	now := time.Now()
	w.held, w.owner, w.since, w.stmt, w.taker = true, owner, now, stmt, *taker
	w.site.Reset()
	w.siteLate = false
	if stmt == "" && (callsite.FastCapture || now.Sub(w.contended) < siteWindow) {
		w.site.CaptureFast()
	}
	w.mu.Unlock()
	return true
}

// takeLocked makes owner the holder of the free lock; w.mu is held.
func (w *Writer[T]) takeLocked(owner any, taker *T, stmt string, now time.Time) {
	w.held, w.owner, w.since, w.stmt, w.taker = true, owner, now, stmt, *taker
	w.site.Reset()
	w.siteLate = false
	if stmt == "" && (callsite.FastCapture || now.Sub(w.contended) < siteWindow) {
		w.site.CaptureFast()
	}
}

// Take takes the writer lock for owner (described by taker) if it is
// free, and returns nil. stmt is the autocommit statement that takes it,
// or "" for a transaction, whose call site is recorded (see Writer). If
// taker's wait would be a certain self-wait it returns nil, the holder and
// self. Otherwise the caller is queued (the holder is the one it waits
// for): it reports the wait and then calls Wait, which it must.
func (w *Writer[T]) Take(ctx context.Context, owner any, taker T, stmt string) (tk *WriterTicket[T], holder WriterHolder[T], self bool) {
	w.mu.Lock()
	now := time.Now()
	if !w.held {
		w.takeLocked(owner, &taker, stmt, now)
		w.mu.Unlock()
		return nil, holder, false
	}
	certain, hint := w.taker.SelfWait(ctx)
	if certain {
		holder = w.holderLocked()
		w.mu.Unlock()
		return nil, holder, true
	}
	tk = &WriterTicket[T]{owner: owner, since: now, granted: make(chan struct{}), stmt: stmt, taker: taker, hint: hint}
	if stmt == "" {
		tk.site.CaptureFast()
	}
	w.waiters = append(w.waiters, tk)
	w.contended = now
	if w.stmt == "" && !w.site.Recorded() {
		w.siteWanted.Store(true)
	}
	holder = w.holderLocked()
	w.mu.Unlock()
	return tk, holder, false
}

// Wait waits for the writer lock tk is queued for (by Take), at most
// timeout (0: no limit beyond ctx). It returns nil once tk holds it;
// otherwise ctx.Err() or ErrTimeout, with the holder then, and tk no
// longer waits.
func (w *Writer[T]) Wait(ctx context.Context, tk *WriterTicket[T], timeout time.Duration) (WriterHolder[T], error) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	err := ErrTimeout
	select {
	case <-tk.granted:
		return WriterHolder[T]{}, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-tk.granted: // handed over meanwhile: keep it
		return WriterHolder[T]{}, nil
	default:
	}
	for i, x := range w.waiters {
		if x == tk {
			w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
			break
		}
	}
	return w.holderLocked(), err
}

// holderLocked returns the holder, to describe once w.mu is released.
func (w *Writer[T]) holderLocked() WriterHolder[T] {
	return WriterHolder[T]{Owner: w.owner, Since: w.since, Stmt: w.stmt, Site: w.site, SiteLate: w.siteLate, Taker: w.taker}
}

// NoteStatementInTx is called at each statement of the transaction that
// holds the writer lock (as owner): if a waiter asked where that
// transaction is, it records the statement's call site. Otherwise it costs
// one atomic load.
func (w *Writer[T]) NoteStatementInTx(owner any) {
	if !w.siteWanted.Load() {
		return
	}
	var site callsite.Stack
	site.Capture()
	w.mu.Lock()
	if w.held && w.owner == owner && w.stmt == "" && !w.site.Recorded() {
		w.site, w.siteLate = site, true
		w.siteWanted.Store(false)
	}
	w.mu.Unlock()
}

// SiteWanted reports whether a waiter asked the holding transaction for
// its call site (NoteStatementInTx has not yet recorded it).
func (w *Writer[T]) SiteWanted() bool { return w.siteWanted.Load() }

// LastWait returns when a writer last had to wait for the lock (zero:
// never).
func (w *Writer[T]) LastWait() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.contended
}

// Unlock releases the writer lock, handing it to the first waiter.
func (w *Writer[T]) Unlock() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handOff()
}

// handOff gives the lock to the first waiter, or frees it; w.mu is held.
// A waiter recorded its own call site when it began waiting.
func (w *Writer[T]) handOff() {
	w.siteWanted.Store(false)
	w.siteLate = false
	if len(w.waiters) == 0 {
		var none T
		w.held, w.owner, w.stmt, w.taker = false, nil, "", none
		w.site.Reset()
		return
	}
	next := w.waiters[0]
	w.waiters[0] = nil
	w.waiters = w.waiters[1:]
	w.owner, w.since, w.stmt, w.site, w.taker = next.owner, time.Now(), next.stmt, next.site, next.taker
	close(next.granted)
}

// Holder returns the writer lock's holder, if it is held.
func (w *Writer[T]) Holder() (WriterHolder[T], bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.held {
		return WriterHolder[T]{}, false
	}
	return w.holderLocked(), true
}

// Waiting returns how many wait for the writer lock.
func (w *Writer[T]) Waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiters)
}

// WriterWaiting describes a waiter for the writer lock.
type WriterWaiting struct {
	Owner any
	Since time.Time      // when it began waiting
	Stmt  string         // the autocommit statement that waits, or
	Site  callsite.Stack // where the transaction that waits begins
}

// Waits calls fn for each waiter of the writer lock and the holder it
// waits for, after copying them under the lock's mutex.
func (w *Writer[T]) Waits(fn func(h WriterHolder[T], wt WriterWaiting)) {
	w.mu.Lock()
	if !w.held || len(w.waiters) == 0 {
		w.mu.Unlock()
		return
	}
	h := w.holderLocked()
	waiters := make([]WriterWaiting, len(w.waiters))
	for i, x := range w.waiters {
		waiters[i] = WriterWaiting{Owner: x.owner, Since: x.since, Stmt: x.stmt, Site: x.site}
	}
	w.mu.Unlock()
	for _, x := range waiters {
		fn(h, x)
	}
}

package lockhooks

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// writerLock is the in-process lock that serialises SQLite writers of one
// database: FIFO, honouring ctx, bounded by the busy timeout. Taking it
// uncontended allocates nothing.
//
// Waiters are told who holds it: the autocommit statement, or where the
// holding transaction began. Finding that call site is a stack walk of
// a microsecond or two, a fifth of an in-memory write transaction, for a
// message that prints only when writers wait for each other, so a
// transaction that takes the lock uncontended records its site only while
// writers have waited within the last siteWindow. A writer that then
// waits for a transaction whose site was not recorded asks for it, and
// the holder records the site of its next statement (see
// noteStatementInTx).
type writerLock struct {
	mu       sync.Mutex
	held     bool
	owner    any
	since    time.Time
	stmt     string            // the autocommit statement holding it, or
	site     callsite.Stack    // where the transaction holding it began (empty: not recorded)
	siteLate bool              // site is that of a later statement of the transaction
	span     trace.SpanContext // the holder's span
	chain    callChain         // the holder's call chain (its BeginTx's, or its statement's), for self-waits
	waiters  []*writerWaiter

	// contended is when a writer last had to wait.
	contended time.Time
	// siteWanted asks the holding transaction for its call site.
	siteWanted atomic.Bool
}

// siteWindow is how long after writers last waited for each other an
// uncontended transaction still records where it began.
const siteWindow = time.Minute

type writerWaiter struct {
	owner   any
	since   time.Time // when it began waiting
	granted chan struct{}
	stmt    string
	site    callsite.Stack
	span    trace.SpanContext
	chain   callChain
}

// lock takes the writer lock for owner, waiting at most timeout (0: no
// limit beyond ctx). stmt is the autocommit statement that takes it, or ""
// for a transaction (begun with ctx, RunInTx's when it began it), whose
// call site is recorded (see writerLock).
func (w *writerLock) lock(ctx context.Context, tel *telemetry, owner any, timeout time.Duration, stmt string) (err error) {
	span := trace.SpanContextFromContext(ctx)
	chain := chainOf(ctx, runOf(ctx))
	w.mu.Lock()
	now := time.Now()
	if !w.held {
		w.held, w.owner, w.since, w.stmt, w.span, w.chain = true, owner, now, stmt, span, chain
		w.site.Reset()
		w.siteLate = false
		if stmt == "" && (callsite.FastCapture || now.Sub(w.contended) < siteWindow) {
			w.site.CaptureFast()
		}
		w.mu.Unlock()
		return nil
	}
	certain, likely := w.chain.selfWait(ctx)
	if certain {
		// The holder is the transaction of RunInTx's fn, which runs on
		// this goroutine: it cannot end while we wait.
		holder := w.holderLocked()
		w.mu.Unlock()
		waiter := "BeginTx of a write transaction"
		if stmt != "" {
			waiter = fmt.Sprintf("the statement %.120q", stmt)
		}
		err := selfWaitError(waiter, "the SQLite writer lock", holder.identity())
		tel.events.add(eventSelfWait, err.Error())
		return err
	}
	hint := ""
	if likely {
		hint = selfWaitHintTx
		if w.stmt != "" {
			hint = selfWaitHintStmt
		}
	}
	wt := &writerWaiter{owner: owner, since: now, granted: make(chan struct{}), stmt: stmt, span: span, chain: chain}
	if stmt == "" {
		wt.site.CaptureFast()
	}
	w.waiters = append(w.waiters, wt)
	w.contended = now
	if w.stmt == "" && !w.site.Recorded() {
		w.siteWanted.Store(true)
	}
	holder := w.holderLocked()
	w.mu.Unlock()

	// Contended: time the wait, linked to the holder.
	_, wait := tel.startWait(ctx, "sqlite_writer", "exclusive", "transaction")
	wait.setWaiter(ownerConn(owner), "", &wt.site, stmt, nil)
	wait.noteSelfHint(hint)
	if wait.wantsHolder() {
		wait.heldBy(holder.identity())
	}
	defer func() { wait.end(ctx, "", err) }()

	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-wt.granted:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
	}
	w.mu.Lock()
	select {
	case <-wt.granted: // handed over meanwhile: keep it
		w.mu.Unlock()
		return nil
	default:
	}
	for i, x := range w.waiters {
		if x == wt {
			w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
			break
		}
	}
	holder = w.holderLocked()
	w.mu.Unlock()
	if hint != "" {
		hint = " (" + hint + ")"
	}
	if err != nil {
		// Cancelled or past its deadline: say what it waited for, how long,
		// and who holds it, still wrapping the context's error.
		return fmt.Errorf("lockhooks: gave up waiting for the SQLite writer lock after %v; held by %s%s: %w",
			time.Since(now).Round(time.Millisecond), holder.describe(), hint, err)
	}
	err = fmt.Errorf("%w: waited %v; held by %s%s; shorten write transactions or raise the busy timeout (lockhooks.WithBusyTimeout)",
		ErrWriterLockTimeout, timeout, holder.describe(), hint)
	tel.events.add(eventWriterTimeout, err.Error())
	return err
}

// holderLocked returns the holder, to describe once w.mu is released.
func (w *writerLock) holderLocked() writerHolder {
	return writerHolder{owner: w.owner, since: w.since, stmt: w.stmt, site: w.site, siteLate: w.siteLate, span: w.span}
}

// noteStatementInTx is called at each statement of the transaction that
// holds the writer lock: if a waiter asked where that transaction is, it
// records the statement's call site. Otherwise it costs one atomic load.
func (w *writerLock) noteStatementInTx(owner any) {
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

// unlock releases the writer lock, handing it to the first waiter.
func (w *writerLock) unlock() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handOff()
}

// handOff gives the lock to the first waiter, or frees it; w.mu is held.
// A waiter recorded its own call site when it began waiting.
func (w *writerLock) handOff() {
	w.siteWanted.Store(false)
	w.siteLate = false
	if len(w.waiters) == 0 {
		w.held, w.owner, w.stmt, w.chain = false, nil, "", callChain{}
		w.site.Reset()
		return
	}
	next := w.waiters[0]
	w.waiters[0] = nil
	w.waiters = w.waiters[1:]
	w.owner, w.since, w.stmt, w.site, w.span, w.chain = next.owner, time.Now(), next.stmt, next.site, next.span, next.chain
	close(next.granted)
}

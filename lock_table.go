package lockhooks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// lockTable is a set of in-process exclusive locks, one per key, created
// on demand and forgotten when free (no memory for keys nobody holds).
// Waiters queue in FIFO order and are handed the lock directly, so nobody
// polls and nobody starves. A holder is identified by an owner value and
// may take a key it holds again (the count stacks).
type lockTable[K comparable] struct {
	mu      sync.Mutex
	entries map[K]*lockEntry
}

// lockEntry is one held key.
type lockEntry struct {
	owner   any
	count   int
	since   time.Time
	site    callsite.Stack    // where the holder took it
	span    trace.SpanContext // the holder's span, for waiters' links
	chain   callChain         // the holder's call chain, for self-waits
	waiters []*lockWaiter
}

// lockWaiter is one goroutine waiting for a key.
type lockWaiter struct {
	owner   any
	since   time.Time // when it began waiting
	site    callsite.Stack
	span    trace.SpanContext
	chain   callChain     // its call chain, recorded by the key when handed over
	granted chan struct{} // closed when the lock is handed to this waiter
}

// holderInfo describes who holds a key, for errors and telemetry.
type holderInfo struct {
	owner any
	since time.Time
	site  callsite.Stack
	span  trace.SpanContext
}

// lock takes key for owner (run: RunInTx's fn whose transaction owner is,
// or nil), waiting while another owner holds it, until ctx ends (then it
// returns a *tableWaitError wrapping ctx.Err() and holds nothing new). A
// wait for a holder certainly of the caller's own call chain (see
// callChain.selfWait) is refused at once with a *tableWaitError; a likely
// one waits, with the hint noted on wait (may be nil) and in the error.
func (t *lockTable[K]) lock(ctx context.Context, key K, owner any, run *fnRun, site *callsite.Stack, wait *lockWait) error {
	span := trace.SpanContextFromContext(ctx)
	chain := chainOf(ctx, run)
	t.mu.Lock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site, span, chain)
		t.mu.Unlock()
		return nil
	}
	certain, likely := e.chain.selfWait(ctx)
	if certain {
		h := e.holderInfo()
		t.mu.Unlock()
		return &tableWaitError{holder: h, self: true}
	}
	hint := ""
	if likely {
		hint = selfWaitHintLock
		if _, tx := e.owner.(txOwner); tx {
			hint = selfWaitHintTx
		}
	}
	w := &lockWaiter{owner: owner, since: time.Now(), span: span, chain: chain, granted: make(chan struct{})}
	if site != nil {
		w.site = *site
	}
	e.waiters = append(e.waiters, w)
	t.mu.Unlock()
	wait.noteSelfHint(hint)

	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-w.granted: // handed over while ctx ended: pass it on
		t.release(key, e)
	default:
		e.removeWaiter(w)
	}
	return &tableWaitError{holder: e.holderInfo(), waited: time.Since(w.since), err: ctx.Err(), hint: hint}
}

// tableWaitError is why lockTable.lock did not take a key: its context
// ended (err), or the holder is of the caller's own call chain (self). It
// carries the holder, which the caller names with the key.
type tableWaitError struct {
	holder holderInfo
	waited time.Duration
	self   bool
	err    error
	hint   string // why the wait was likely a self-wait, or ""
}

func (e *tableWaitError) Error() string {
	if e.self {
		return ErrSelfWait.Error()
	}
	return e.err.Error()
}

func (e *tableWaitError) Unwrap() error {
	if e.self {
		return ErrSelfWait
	}
	return e.err
}

// explainTableWait turns a *tableWaitError of a wait for key (named by
// what) into the caller's error: a self-wait, or how long the caller
// (waiter) waited and who holds the key, wrapping the context's error.
// Other errors are returned unchanged.
func explainTableWait(err error, waiter, what, key string) error {
	var tw *tableWaitError
	if !errors.As(err, &tw) {
		return err
	}
	h := tableHolder(key, tw.holder)
	if tw.self {
		return selfWaitError(waiter, what, h)
	}
	hint := ""
	if tw.hint != "" {
		hint = " (" + tw.hint + ")"
	}
	if h.Conn == 0 && h.Since.IsZero() { // freed meanwhile
		return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v%s: %w", waiter, what, tw.waited.Round(time.Millisecond), hint, tw.err)
	}
	return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v; it is held by %s%s: %w", waiter, what, tw.waited.Round(time.Millisecond), h, hint, tw.err)
}

// holderInfo describes the entry's holder; the table's mutex is held.
func (e *lockEntry) holderInfo() holderInfo {
	if e.count == 0 {
		return holderInfo{}
	}
	return holderInfo{owner: e.owner, since: e.since, site: e.site, span: e.span}
}

// tryLock takes key for owner (of run, as lock) if nobody else holds it;
// ctx is the caller's (its span for the links of later waiters, itself
// for their self-wait check).
func (t *lockTable[K]) tryLock(ctx context.Context, key K, owner any, run *fnRun, site *callsite.Stack) bool {
	chain := chainOf(ctx, run)
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site, trace.SpanContextFromContext(ctx), chain)
		return true
	}
	return false
}

// unlock releases one hold of key by owner; it reports false if owner does
// not hold key.
func (t *lockTable[K]) unlock(key K, owner any) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 || e.owner != owner {
		return false
	}
	t.release(key, e)
	return true
}

// tableEntry is a copy of one entry's owner and waiters (entriesNow).
type tableEntry[K comparable] struct {
	key     K
	owner   any
	waiters []any // their owners, in queue order
}

// entriesNow copies the held keys' owners and waiters, for a caller that
// looks at them with other locks taken (the table's mutex is a leaf).
func (t *lockTable[K]) entriesNow() []tableEntry[K] {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]tableEntry[K], 0, len(t.entries))
	for k, e := range t.entries {
		if e.count == 0 {
			continue
		}
		x := tableEntry[K]{key: k, owner: e.owner, waiters: make([]any, len(e.waiters))}
		for i, w := range e.waiters {
			x.waiters[i] = w.owner
		}
		out = append(out, x)
	}
	return out
}

// handOver gives key, held by from, to owner to, with its count; it
// reports false if from does not hold key.
func (t *lockTable[K]) handOver(key K, from, to any) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 || e.owner != from {
		return false
	}
	e.owner = to
	return true
}

// holder returns who holds key, if anyone.
func (t *lockTable[K]) holder(key K) (holderInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 {
		return holderInfo{}, false
	}
	return holderInfo{owner: e.owner, since: e.since, site: e.site, span: e.span}, true
}

// size returns the number of keys held or waited for.
func (t *lockTable[K]) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// entry returns key's entry, creating it; t.mu is held.
func (t *lockTable[K]) entry(key K) *lockEntry {
	if t.entries == nil {
		t.entries = make(map[K]*lockEntry)
	}
	e, ok := t.entries[key]
	if !ok {
		e = &lockEntry{}
		t.entries[key] = e
	}
	return e
}

// release drops one hold and hands the key to the first waiter when the
// count reaches zero; t.mu is held.
func (t *lockTable[K]) release(key K, e *lockEntry) {
	e.count--
	if e.count > 0 {
		return
	}
	if len(e.waiters) == 0 {
		delete(t.entries, key)
		return
	}
	w := e.waiters[0]
	e.waiters[0] = nil
	e.waiters = e.waiters[1:]
	e.take(w.owner, &w.site, w.span, w.chain)
	close(w.granted)
}

func (e *lockEntry) take(owner any, site *callsite.Stack, span trace.SpanContext, chain callChain) {
	if e.count == 0 {
		e.owner, e.since, e.span, e.chain = owner, time.Now(), span, chain
		if site != nil {
			e.site = *site
		} else {
			e.site = callsite.Stack{}
		}
	}
	e.count++
}

func (e *lockEntry) removeWaiter(w *lockWaiter) {
	for i, x := range e.waiters {
		if x == w {
			e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
			return
		}
	}
}

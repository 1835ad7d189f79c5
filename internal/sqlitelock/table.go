package sqlitelock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// A Taker is what the caller records of whoever takes a lock (its call
// chain, its span): the lock keeps it with the hold, hands it back in the
// holder's description, and asks it whether a wait for that hold is a
// self-wait.
type Taker interface {
	// SelfWait classifies a wait with ctx, on the calling goroutine, for
	// what this taker holds: certain when the holder cannot end while the
	// caller waits (the wait is refused at once); otherwise hint says why
	// the wait is likely a self-wait, or is "" when it is not.
	SelfWait(ctx context.Context) (certain bool, hint string)
}

// Table is a set of in-process exclusive locks, one per key, created on
// demand and forgotten when free (no memory for keys nobody holds).
// Waiters queue in FIFO order and are handed the lock directly, so nobody
// polls and nobody starves. A holder is identified by an owner value and
// may take a key it holds again (the count stacks). Its zero value is an
// empty table.
type Table[K comparable, T Taker] struct {
	mu      sync.Mutex
	entries map[K]*Hold[T]
}

// Hold is one held key of a Table.
type Hold[T Taker] struct {
	owner   any
	count   int
	since   time.Time
	site    callsite.Stack // where the holder took it
	taker   T              // the holder, as the caller described it
	waiters []*Ticket[T]
}

// Ticket is one goroutine's place in the queue of a key.
type Ticket[T Taker] struct {
	owner   any
	since   time.Time // when it began waiting
	site    callsite.Stack
	taker   T
	hint    string        // why the wait is likely a self-wait, or ""
	granted chan struct{} // closed when the lock is handed to this waiter
	entry   *Hold[T]
}

// Hint says why the queued wait is likely a self-wait, or is "".
func (tk *Ticket[T]) Hint() string { return tk.hint }

// Holder describes who holds a key, for errors and telemetry.
type Holder[T Taker] struct {
	Owner any
	Since time.Time
	Site  callsite.Stack // where it took the key (empty: not recorded)
	Taker T
}

// ErrSelfWait is wrapped by the WaitError of a wait refused because the
// key's holder is of the waiter's own call chain (its Taker was certain):
// the holder cannot release the key while the waiter waits.
var ErrSelfWait = errors.New("sqlitelock: the lock is held by the waiter's own call chain")

// WaitError is why a wait did not take a key: its context ended (Err), or
// the holder is of the caller's own call chain (Self). It carries the
// holder, which the caller names with the key.
type WaitError[T Taker] struct {
	Holder Holder[T] // zero when the key was freed meanwhile
	Waited time.Duration
	Self   bool
	Err    error  // the context's error, when not Self
	Hint   string // why the wait was likely a self-wait, or ""
}

// Error returns the context's error text, or ErrSelfWait's.
func (e *WaitError[T]) Error() string {
	if e.Self {
		return ErrSelfWait.Error()
	}
	return e.Err.Error()
}

// Unwrap returns the context's error, or ErrSelfWait.
func (e *WaitError[T]) Unwrap() error {
	if e.Self {
		return ErrSelfWait
	}
	return e.Err
}

// Take takes key for owner (described by taker; site is where, or nil) if
// nobody else holds it, and returns nil, nil. A wait for a holder whose
// Taker is certain it is a self-wait is refused with a *WaitError (Self).
// Otherwise the caller is queued: it reports the wait (the Ticket's Hint)
// and then calls Wait, which it must.
func (t *Table[K, T]) Take(ctx context.Context, key K, owner any, taker T, site *callsite.Stack) (*Ticket[T], error) {
	t.mu.Lock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site, taker)
		t.mu.Unlock()
		return nil, nil
	}
	certain, hint := e.taker.SelfWait(ctx)
	if certain {
		h := e.holder()
		t.mu.Unlock()
		return nil, &WaitError[T]{Holder: h, Self: true}
	}
	tk := &Ticket[T]{owner: owner, since: time.Now(), taker: taker, hint: hint, granted: make(chan struct{}), entry: e}
	if site != nil {
		tk.site = *site
	}
	e.waiters = append(e.waiters, tk)
	t.mu.Unlock()
	return tk, nil
}

// Wait waits for the key tk is queued for (by Take), until ctx ends: then
// it returns a *WaitError wrapping ctx.Err() and holds nothing new.
func (t *Table[K, T]) Wait(ctx context.Context, key K, tk *Ticket[T]) error {
	select {
	case <-tk.granted:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := tk.entry
	select {
	case <-tk.granted: // handed over while ctx ended: pass it on
		t.release(key, e)
	default:
		e.removeWaiter(tk)
	}
	return &WaitError[T]{Holder: e.holder(), Waited: time.Since(tk.since), Err: ctx.Err(), Hint: tk.hint}
}

// holder describes the entry's holder; the table's mutex is held.
func (e *Hold[T]) holder() Holder[T] {
	if e.count == 0 {
		return Holder[T]{}
	}
	return Holder[T]{Owner: e.owner, Since: e.since, Site: e.site, Taker: e.taker}
}

// TryTake takes key for owner (as Take) if nobody else holds it, and
// reports whether it did.
func (t *Table[K, T]) TryTake(key K, owner any, taker T, site *callsite.Stack) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site, taker)
		return true
	}
	return false
}

// Unlock releases one hold of key by owner; it reports false if owner
// does not hold key.
func (t *Table[K, T]) Unlock(key K, owner any) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 || e.owner != owner {
		return false
	}
	t.release(key, e)
	return true
}

// HandOver gives key, held by from, to owner to, with its count (its
// taker stays the one that took it); it reports false if from does not
// hold key.
func (t *Table[K, T]) HandOver(key K, from, to any) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 || e.owner != from {
		return false
	}
	e.owner = to
	return true
}

// Holder returns who holds key, if anyone.
func (t *Table[K, T]) Holder(key K) (Holder[T], bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 {
		return Holder[T]{}, false
	}
	return e.holder(), true
}

// Size returns the number of keys held or waited for.
func (t *Table[K, T]) Size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// entry returns key's entry, creating it; t.mu is held.
func (t *Table[K, T]) entry(key K) *Hold[T] {
	if t.entries == nil {
		t.entries = make(map[K]*Hold[T])
	}
	e, ok := t.entries[key]
	if !ok {
		e = &Hold[T]{}
		t.entries[key] = e
	}
	return e
}

// release drops one hold and hands the key to the first waiter when the
// count reaches zero; t.mu is held.
func (t *Table[K, T]) release(key K, e *Hold[T]) {
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
	e.take(w.owner, &w.site, w.taker)
	close(w.granted)
}

// take adds a hold by owner, recording it as the holder if it is the
// first; the table's mutex is held.
func (e *Hold[T]) take(owner any, site *callsite.Stack, taker T) {
	if e.count == 0 {
		e.owner, e.since, e.taker = owner, time.Now(), taker
		if site != nil {
			e.site = *site
		} else {
			e.site = callsite.Stack{}
		}
	}
	e.count++
}

// removeWaiter drops w from the queue; the table's mutex is held.
func (e *Hold[T]) removeWaiter(w *Ticket[T]) {
	for i, x := range e.waiters {
		if x == w {
			e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
			return
		}
	}
}

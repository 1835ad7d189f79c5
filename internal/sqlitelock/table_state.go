package sqlitelock

// What a Table shows of itself: its held keys, their holders and waiters,
// copied under its mutex (a leaf: callers look at the copies with other
// locks taken) or visited under it.

import (
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// Owner returns the hold's owner.
func (e *Hold[T]) Owner() any { return e.owner }

// Since returns when the holder took the key.
func (e *Hold[T]) Since() time.Time { return e.since }

// Site returns where the holder took the key; the stack is the table's,
// to read only during the EachHeld call that offered e.
func (e *Hold[T]) Site() *callsite.Stack { return &e.site }

// Count returns how many times the holder took the key.
func (e *Hold[T]) Count() int { return e.count }

// Waiters returns how many wait for the key.
func (e *Hold[T]) Waiters() int { return len(e.waiters) }

// EachHeld calls fn for each held key under the table's mutex, until fn
// returns false: fn must be quick, must not take other locks and must not
// keep e.
func (t *Table[K, T]) EachHeld(fn func(key K, e *Hold[T]) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.entries {
		if e.count > 0 && !fn(k, e) {
			return
		}
	}
}

// heldCopy is a copy of one held key of a Table.
type heldCopy[K comparable, T Taker] struct {
	key   K
	h     Holder[T]
	count int
}

// Held calls fn for each held key, after copying them under the table's
// mutex (call sites are symbolised outside the table's lock).
func (t *Table[K, T]) Held(fn func(key K, h Holder[T], count int)) {
	t.mu.Lock()
	var out []heldCopy[K, T]
	for k, e := range t.entries {
		if e.count > 0 {
			out = append(out, heldCopy[K, T]{k, e.holder(), e.count})
		}
	}
	t.mu.Unlock()
	for _, x := range out {
		fn(x.key, x.h, x.count)
	}
}

// Waiting describes one waiter of a Table.
type Waiting struct {
	Owner any
	Since time.Time      // when it began waiting
	Site  callsite.Stack // where it asked (empty: not recorded)
}

// Waits calls fn for each waiter and the holder it waits for, after
// copying them under the table's mutex.
func (t *Table[K, T]) Waits(fn func(key K, h Holder[T], w Waiting)) {
	type edge struct {
		key K
		h   Holder[T]
		w   Waiting
	}
	var out []edge
	t.mu.Lock()
	for k, e := range t.entries {
		if e.count == 0 {
			continue
		}
		h := e.holder()
		for _, w := range e.waiters {
			out = append(out, edge{k, h, Waiting{Owner: w.owner, Since: w.since, Site: w.site}})
		}
	}
	t.mu.Unlock()
	for _, x := range out {
		fn(x.key, x.h, x.w)
	}
}

// Entry is a copy of one held key's owner and waiters (Entries).
type Entry[K comparable] struct {
	Key     K
	Owner   any
	Waiters []any // their owners, in queue order
}

// Entries copies the held keys' owners and waiters, for a caller that
// looks at them with other locks taken (the table's mutex is a leaf).
func (t *Table[K, T]) Entries() []Entry[K] {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Entry[K], 0, len(t.entries))
	for k, e := range t.entries {
		if e.count == 0 {
			continue
		}
		x := Entry[K]{Key: k, Owner: e.owner, Waiters: make([]any, len(e.waiters))}
		for i, w := range e.waiters {
			x.Waiters[i] = w.owner
		}
		out = append(out, x)
	}
	return out
}

package inprocess

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// Table is a set of in-process exclusive locks, one per key (see
// sqlitelock.Table), taken by [Taker]s and described as the model names
// them.
type Table[K comparable] struct {
	core sqlitelock.Table[K, Taker]
}

// Holder describes who holds a key, for errors and telemetry.
type Holder struct {
	Owner any
	Since time.Time
	Site  callsite.Stack
	Span  trace.SpanContext
}

// holderOf is the table's description of a holder, as the model keeps it.
func holderOf(h *sqlitelock.Holder[Taker]) Holder {
	return Holder{Owner: h.Owner, Since: h.Since, Site: h.Site, Span: h.Taker.Span}
}

// HintNoter is told a wait's self-wait hint before it waits (the caller's
// record of the wait, for its slow-wait log line and timeout error); its
// method must accept a nil receiver.
type HintNoter interface {
	NoteSelfHint(hint string)
}

// Lock takes key for owner, waiting while another owner holds it, until
// ctx ends (then it returns a *sqlitelock.WaitError wrapping ctx.Err() and
// holds nothing new). A wait for a holder certainly of the caller's own
// call chain (see callsite.Chain.SelfWait) is refused at once with a
// *sqlitelock.WaitError (Owners.ExplainWait makes either the caller's
// error); a likely one waits, with the hint noted on wait (may be nil) and
// in the error.
func (t *Table[K]) Lock(ctx context.Context, key K, owner any, taker Taker, site *callsite.Stack, wait HintNoter) error {
	tk, err := t.core.Take(ctx, key, owner, taker, site)
	if tk == nil {
		return err
	}
	if wait != nil {
		wait.NoteSelfHint(tk.Hint())
	}
	return t.core.Wait(ctx, key, tk)
}

// TryLock takes key for owner if nobody else holds it.
func (t *Table[K]) TryLock(key K, owner any, taker Taker, site *callsite.Stack) bool {
	return t.core.TryTake(key, owner, taker, site)
}

// Unlock releases one hold of key by owner; it reports false if owner does
// not hold key.
func (t *Table[K]) Unlock(key K, owner any) bool { return t.core.Unlock(key, owner) }

// HandOver gives key, held by from, to owner to, with its count; it
// reports false if from does not hold key.
func (t *Table[K]) HandOver(key K, from, to any) bool { return t.core.HandOver(key, from, to) }

// Holder returns who holds key, if anyone.
func (t *Table[K]) Holder(key K) (Holder, bool) {
	h, ok := t.core.Holder(key)
	if !ok {
		return Holder{}, false
	}
	return holderOf(&h), true
}

// Size returns the number of keys held or waited for.
func (t *Table[K]) Size() int { return t.core.Size() }

// Entries copies the held keys' owners and waiters, for a caller that
// looks at them with other locks taken (the table's mutex is a leaf).
func (t *Table[K]) Entries() []sqlitelock.Entry[K] { return t.core.Entries() }

// Held calls fn for each held key, after copying them under the table's
// mutex (call sites are symbolised outside the table's lock).
func (t *Table[K]) Held(fn func(key K, h Holder, count int)) {
	t.core.Held(func(key K, h sqlitelock.Holder[Taker], count int) { fn(key, holderOf(&h), count) })
}

// Waits calls fn for each waiter and the holder it waits for, after
// copying them under the table's mutex.
func (t *Table[K]) Waits(fn func(key K, h Holder, w sqlitelock.Waiting)) {
	t.core.Waits(func(key K, h sqlitelock.Holder[Taker], w sqlitelock.Waiting) { fn(key, holderOf(&h), w) })
}

// EachHeld calls fn for each held key under the table's mutex, until fn
// returns false: fn must be quick and must not take other locks.
func (t *Table[K]) EachHeld(fn func(key K, e *sqlitelock.Hold[Taker]) bool) { t.core.EachHeld(fn) }

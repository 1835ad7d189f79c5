package lockhooks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// lockTaker is who takes an in-process lock, as the lock keeps it (see
// sqlitelock.Taker): its call chain, for the self-wait checks of its
// waiters; its span, for their links; and the hint a waiter whose wait is
// likely a self-wait is given, which depends on what the taker is.
type lockTaker struct {
	chain callsite.Chain
	span  trace.SpanContext
	hint  string // selfWaitHintTx, selfWaitHintLock or selfWaitHintStmt
}

// SelfWait classifies a wait with ctx for what the taker holds (see
// callsite.Chain.SelfWait).
func (t lockTaker) SelfWait(ctx context.Context) (certain bool, hint string) {
	certain, likely := t.chain.SelfWait(ctx)
	if certain || !likely {
		return certain, ""
	}
	return false, t.hint
}

// takerOf describes the caller, taking a lock for owner with ctx (run:
// RunInTx's fn whose transaction owner is, or nil): a likely self-wait
// for what it holds is one on a transaction's lock if owner is a
// transaction, else on a lock.
func takerOf(ctx context.Context, owner any, run *callsite.Run) lockTaker {
	t := lockTaker{chain: chainOf(ctx, run), span: trace.SpanContextFromContext(ctx), hint: selfWaitHintLock}
	if _, tx := owner.(txOwner); tx {
		t.hint = selfWaitHintTx
	}
	return t
}

// lockTable is a set of in-process exclusive locks, one per key (see
// sqlitelock.Table), whose holders are described as lockhooks names them.
type lockTable[K comparable] struct {
	core sqlitelock.Table[K, lockTaker]
}

// holderInfo describes who holds a key, for errors and telemetry.
type holderInfo struct {
	owner any
	since time.Time
	site  callsite.Stack
	span  trace.SpanContext
}

// holderInfoOf is the table's description of a holder, as lockhooks keeps
// it.
func holderInfoOf(h *sqlitelock.Holder[lockTaker]) holderInfo {
	return holderInfo{owner: h.Owner, since: h.Since, site: h.Site, span: h.Taker.span}
}

// lock takes key for owner (run: RunInTx's fn whose transaction owner is,
// or nil), waiting while another owner holds it, until ctx ends (then it
// returns a *sqlitelock.WaitError wrapping ctx.Err() and holds nothing
// new). A wait for a holder certainly of the caller's own call chain (see
// callsite.Chain.SelfWait) is refused at once with a *sqlitelock.WaitError
// (explainTableWait makes either the caller's error); a likely
// one waits, with the hint noted on wait (may be nil) and in the error.
func (t *lockTable[K]) lock(ctx context.Context, key K, owner any, run *callsite.Run, site *callsite.Stack, wait *lockWait) error {
	tk, err := t.core.Take(ctx, key, owner, takerOf(ctx, owner, run), site)
	if tk == nil {
		return err
	}
	wait.noteSelfHint(tk.Hint())
	return t.core.Wait(ctx, key, tk)
}

// tryLock takes key for owner (of run, as lock) if nobody else holds it;
// ctx is the caller's (its span for the links of later waiters, itself
// for their self-wait check).
func (t *lockTable[K]) tryLock(ctx context.Context, key K, owner any, run *callsite.Run, site *callsite.Stack) bool {
	return t.core.TryTake(key, owner, takerOf(ctx, owner, run), site)
}

// unlock releases one hold of key by owner; it reports false if owner does
// not hold key.
func (t *lockTable[K]) unlock(key K, owner any) bool { return t.core.Unlock(key, owner) }

// handOver gives key, held by from, to owner to, with its count; it
// reports false if from does not hold key.
func (t *lockTable[K]) handOver(key K, from, to any) bool { return t.core.HandOver(key, from, to) }

// holder returns who holds key, if anyone.
func (t *lockTable[K]) holder(key K) (holderInfo, bool) {
	h, ok := t.core.Holder(key)
	if !ok {
		return holderInfo{}, false
	}
	return holderInfoOf(&h), true
}

// size returns the number of keys held or waited for.
func (t *lockTable[K]) size() int { return t.core.Size() }

// tableEntry is a copy of one entry's owner and waiters (entriesNow).
type tableEntry[K comparable] struct {
	key     K
	owner   any
	waiters []any // their owners, in queue order
}

// entriesNow copies the held keys' owners and waiters, for a caller that
// looks at them with other locks taken (the table's mutex is a leaf).
func (t *lockTable[K]) entriesNow() []tableEntry[K] {
	entries := t.core.Entries()
	out := make([]tableEntry[K], len(entries))
	for i, e := range entries {
		out[i] = tableEntry[K]{key: e.Key, owner: e.Owner, waiters: e.Waiters}
	}
	return out
}

// explainTableWait turns a *sqlitelock.WaitError of a wait for key (named
// by what) into the caller's error: a self-wait (wrapping ErrSelfWait), or
// how long the caller (waiter) waited and who holds the key, wrapping the
// context's error. Other errors are returned unchanged.
func explainTableWait(err error, waiter, what, key string) error {
	var tw *sqlitelock.WaitError[lockTaker]
	if !errors.As(err, &tw) {
		return err
	}
	h := tableHolder(key, holderInfoOf(&tw.Holder))
	if tw.Self {
		return selfWaitError(waiter, what, h)
	}
	hint := ""
	if tw.Hint != "" {
		hint = " (" + tw.Hint + ")"
	}
	if h.Conn == 0 && h.Since.IsZero() { // freed meanwhile
		return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v%s: %w", waiter, what, tw.Waited.Round(time.Millisecond), hint, tw.Err)
	}
	return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v; it is held by %s%s: %w", waiter, what, tw.Waited.Round(time.Millisecond), h, hint, tw.Err)
}

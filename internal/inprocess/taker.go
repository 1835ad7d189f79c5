package inprocess

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
)

// Taker is who takes an in-process lock, as the lock keeps it (see
// sqlitelock.Taker): its call chain, for the self-wait checks of its
// waiters; its span, for their links; and the hint a waiter whose wait is
// likely a self-wait is given, which depends on what the taker is.
type Taker struct {
	Chain callsite.Chain
	Span  trace.SpanContext
	Hint  string // HintTx, HintLock or HintStmt
}

// SelfWait classifies a wait with ctx for what the taker holds (see
// callsite.Chain.SelfWait).
func (t Taker) SelfWait(ctx context.Context) (certain bool, hint string) {
	certain, likely := t.Chain.SelfWait(ctx)
	if certain || !likely {
		return certain, ""
	}
	return false, t.Hint
}

// Hints of a likely self-wait, by what holds the lock.
const (
	HintTx   = "held by a transaction this goroutine began with this context: likely a self-wait, unless another goroutine ends that transaction; use tx.ExecContext"
	HintLock = "held by a lock this goroutine took with this context: likely a self-wait, unless another goroutine releases it; release it first"
	HintStmt = "held by a statement this goroutine runs with this context: likely a self-wait if its rows are still open; close them first"
)

// ErrSelfWait is wrapped by the error of a wait for a lock held by the
// transaction of a RunInTx attempt whose fn is running on the very
// goroutine that waits; the root exports it (its doc says when it fires).
var ErrSelfWait = errors.New("lockhooks: a statement would wait for a lock its own call chain's transaction holds")

// SelfWaitError is the error of a wait (by waiter) for what, which h
// holds for the waiter's own call chain.
func SelfWaitError(waiter, what string, h holders.Holder) error {
	return fmt.Errorf("%w: %s would wait for %s, which %s holds: that transaction was begun by RunInTx, whose fn is running on this same goroutine and is blocked in this call, so it cannot end while this call waits; run the statement through the transaction (tx.ExecContext, not db.ExecContext), or commit it first",
		ErrSelfWait, waiter, what, h)
}

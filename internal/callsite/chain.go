package callsite

import (
	"context"
	"sync/atomic"
)

// Run is one call of a function that runs on one goroutine while the
// transactions it began are open (RunInTx's fn): a wait on that goroutine
// for a lock one of them holds can end only by its timeout. It is running
// only while the function runs; while it runs its goroutine is alive, so
// the goroutine's identity names no other goroutine. Its zero value is not
// running; OnThisStack on a nil *Run reports false.
type Run struct {
	g       uintptr
	running atomic.Bool
}

// Here records the current goroutine as the one the function runs on:
// once, before the Run is shared with other goroutines (what it records is
// read by them without synchronisation).
func (r *Run) Here() { r.g = CurrentGoroutine() }

// SetRunning records whether the function runs now.
func (r *Run) SetRunning(on bool) { r.running.Store(on) }

// OnThisStack reports whether the function is running on the current
// goroutine.
func (r *Run) OnThisStack() bool {
	return r != nil && r.g != 0 && r.running.Load() && r.g == CurrentGoroutine()
}

// Chain is who holds a lock, for the self-wait checks of its waiters:
// the context and goroutine it took the lock (or began its transaction)
// with, and the Run whose transaction holds it (nil: none).
type Chain struct {
	ctx context.Context
	g   uintptr
	run *Run
}

// ChainOf is the current goroutine's call chain with ctx, for a hold of
// run's transaction (run may be nil).
func ChainOf(ctx context.Context, run *Run) Chain {
	return Chain{ctx: ctx, g: CurrentGoroutine(), run: run}
}

// SelfWait classifies a wait with ctx for what h holds: certain when h's
// transaction is a Run's and the Run is on this goroutine; likely when h
// took it on this goroutine with this very context (it may have been
// handed to another goroutine since, or the goroutine's descriptor reused:
// a hint, never a failure).
func (h Chain) SelfWait(ctx context.Context) (certain, likely bool) {
	if h.run.OnThisStack() {
		return true, true
	}
	return false, SameCallChain(ctx, h.ctx, h.g)
}

// SameCallChain reports whether work run with ctx on the current
// goroutine looks like the call chain that took a lock (or began a
// transaction) with holderCtx on goroutine holderG (CurrentGoroutine): the
// same goroutine, with the same context. It is only a hint: the lock or
// transaction may have been handed to another goroutine, the holder's
// goroutine may have exited and its descriptor been reused, and
// context.Background() values all compare equal.
func SameCallChain(ctx, holderCtx context.Context, holderG uintptr) bool {
	g := CurrentGoroutine()
	return g != 0 && g == holderG && sameContext(ctx, holderCtx)
}

// sameContext reports whether a and b are the same context value. A
// context type that cannot be compared is never the same.
func sameContext(a, b context.Context) (same bool) {
	if a == nil || b == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			same = false // an uncomparable value inside a comparable-looking context
		}
	}()
	return a == b
}

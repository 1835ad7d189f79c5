package holding

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// Tx is a connection's open transaction as other goroutines see it: when
// and where it began, its span and the context it was begun with. The
// transaction's own state belongs to the connection's goroutine; this
// copy is guarded by its mutex, and its goroutine is atomic so that a
// waiter's scan for a self-wait ([SelfWait]) passes most transactions by
// without locking.
type Tx struct {
	g     atomic.Uintptr // the goroutine that began it (callsite.CurrentGoroutine)
	mu    sync.Mutex
	open  bool
	since time.Time
	site  callsite.Stack
	span  trace.SpanContext
	ctx   context.Context
}

// Began records that a transaction began with ctx at site (nil: not
// recorded) on the current goroutine.
func (t *Tx) Began(ctx context.Context, since time.Time, site *callsite.Stack) {
	t.g.Store(callsite.CurrentGoroutine())
	t.mu.Lock()
	t.open, t.since, t.ctx = true, since, ctx
	t.span = trace.SpanContextFromContext(ctx)
	if site != nil {
		t.site = *site
	} else {
		t.site.Reset()
	}
	t.mu.Unlock()
}

// Ended records that the transaction ended.
func (t *Tx) Ended() {
	t.g.Store(0)
	t.mu.Lock()
	t.open, t.ctx = false, nil
	t.site.Reset()
	t.mu.Unlock()
}

// Goroutine is the goroutine that began the open transaction (0: none,
// or goroutines cannot be told apart here).
func (t *Tx) Goroutine() uintptr { return t.g.Load() }

// Snapshot returns the transaction's identity, if one is open.
func (t *Tx) Snapshot() (since time.Time, site callsite.Stack, span trace.SpanContext, ctx context.Context, open bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.since, t.site, t.span, t.ctx, t.open
}

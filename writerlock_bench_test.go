package lockhooks

import (
	"context"
	"testing"
)

//go:noinline
func userBeginsWrite(w *writerLock, ctx context.Context) {
	if err := w.lock(ctx, noTelemetry, 1, 0, ""); err != nil {
		panic(err)
	}
	w.unlock()
}

// BenchmarkWriterLockUncontended is what a write transaction pays for the
// writer lock when nobody waits (with its call-site capture).
func BenchmarkWriterLockUncontended(b *testing.B) {
	var w writerLock
	ctx := context.Background()
	for b.Loop() {
		userBeginsWrite(&w, ctx)
	}
}

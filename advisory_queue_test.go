package lockhooks

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Waiters do not each pin a connection: 20 goroutines wait for a key
// another process holds through a pool of 4; only one connection waits on
// the server, ordinary queries still run meanwhile, and once the other
// process releases, all 20 get the lock in turn, one at a time.
func TestAcquireWaitersQueueInMemory(t *testing.T) {
	e := newPinEnv(t)
	e.wrapped.SetMaxOpenConns(4)
	ctx := context.Background()
	const key, n = 4242, 20
	other := otherConn(t, e.raw)
	mustExec(t, other, "SELECT pg_advisory_lock($1)", key)

	var inside, overlaps, done atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := AcquireAdvisoryLock(ctx, e.wrapped, key)
			if err != nil {
				errs <- err
				return
			}
			if inside.Add(1) > 1 {
				overlaps.Add(1)
			}
			inside.Add(-1)
			done.Add(1)
			errs <- l.Release(ctx)
		}()
	}
	// One of them waits on the server; the others wait in memory.
	waitFor(t, 10*time.Second, "a server-side waiter", func() bool { return waitingBackends(t, e) == 1 })
	for range 5 {
		var one int
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := e.wrapped.QueryRowContext(qctx, "SELECT 1").Scan(&one)
		cancel()
		if err != nil {
			t.Fatalf("an ordinary query while 20 acquirers wait: %v", err)
		}
		if w := waitingBackends(t, e); w > 1 {
			t.Fatalf("%d backends of this database wait on the server, want 1", w)
		}
	}
	if done.Load() != 0 {
		t.Fatal("an acquirer got the lock the other process holds")
	}
	mustExec(t, other, "SELECT pg_advisory_unlock($1)", key)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if done.Load() != n || overlaps.Load() != 0 {
		t.Fatalf("%d acquired, %d times while another held it; want %d, 0", done.Load(), overlaps.Load(), n)
	}
}

// waitingBackends counts this database's backends waiting for a lock.
func waitingBackends(t testing.TB, e *pinEnv) int {
	t.Helper()
	var n int
	if err := e.raw.QueryRow(`SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE NOT l.granted AND a.application_name = $1`, e.app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TryAdvisoryLock of a key another acquirer of this process holds answers
// false at once, without a round trip; a cancelled in-memory waiter leaves
// the queue.
func TestTryAndCancelInTheInProcessQueue(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 77)
	if err != nil {
		t.Fatal(err)
	}
	if l2, ok, err := TryAdvisoryLock(ctx, e.wrapped, 77); ok || err != nil || l2 != nil {
		t.Fatalf("try of a key held in this process: %v %v %v", l2, ok, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := AcquireAdvisoryLock(short, e.wrapped, 77); err == nil {
		t.Fatal("a second acquire got the held key")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = AcquireAdvisoryLock(ctx, e.wrapped, 77)
	if err != nil {
		t.Fatalf("acquire after the cancelled waiter left: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

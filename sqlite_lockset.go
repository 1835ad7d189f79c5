package lockhooks

import (
	"context"
	"sync"
	"time"
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
	site    string // where the holder took it
	waiters []*lockWaiter
}

// lockWaiter is one goroutine waiting for a key.
type lockWaiter struct {
	owner   any
	site    string
	granted chan struct{} // closed when the lock is handed to this waiter
}

// holderInfo describes who holds a key, for errors and telemetry.
type holderInfo struct {
	owner any
	since time.Time
	site  string
}

// lock takes key for owner, waiting while another owner holds it, until
// ctx ends (then it returns ctx.Err() and holds nothing new).
func (t *lockTable[K]) lock(ctx context.Context, key K, owner any, site string) error {
	t.mu.Lock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site)
		t.mu.Unlock()
		return nil
	}
	w := &lockWaiter{owner: owner, site: site, granted: make(chan struct{})}
	e.waiters = append(e.waiters, w)
	t.mu.Unlock()

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
	return ctx.Err()
}

// tryLock takes key for owner if nobody else holds it.
func (t *lockTable[K]) tryLock(key K, owner any, site string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(key)
	if e.count == 0 || e.owner == owner {
		e.take(owner, site)
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

// holder returns who holds key, if anyone.
func (t *lockTable[K]) holder(key K) (holderInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || e.count == 0 {
		return holderInfo{}, false
	}
	return holderInfo{owner: e.owner, since: e.since, site: e.site}, true
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
	e.take(w.owner, w.site)
	close(w.granted)
}

func (e *lockEntry) take(owner any, site string) {
	if e.count == 0 {
		e.owner, e.since, e.site = owner, time.Now(), site
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

package sqlitelock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// taker is a test Taker: a wait with the very context it took its lock
// with is a certain self-wait (self) or a likely one (hint).
type taker struct {
	ctx  context.Context
	self bool
	hint string
}

// SelfWait is certain, or likely with the hint, for a wait with t's own
// context.
func (t taker) SelfWait(ctx context.Context) (bool, string) {
	if t.ctx == nil || ctx != t.ctx {
		return false, ""
	}
	if t.self {
		return true, ""
	}
	return false, t.hint
}

// waitDone fails the test unless done is closed within a deadline.
func waitDone(t *testing.T, done chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not finish", what)
	}
}

// Random lock, try-lock and cancelled waits by several goroutines leave no
// entry behind, and each key has one holder at a time.
func TestTableLeavesNothingBehind(t *testing.T) {
	var table Table[int, taker]
	var holders [20]atomic.Int32
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 2))
			owner := fmt.Sprint("owner", w)
			hold := func(k int) {
				if n := holders[k].Add(1); n != 1 {
					t.Errorf("key %d has %d holders", k, n)
				}
				holders[k].Add(-1)
				if !table.Unlock(k, owner) {
					t.Errorf("%s could not release key %d it holds", owner, k)
				}
			}
			for range 10000 / 8 {
				k := r.IntN(20)
				if r.IntN(2) == 0 {
					if table.TryTake(k, owner, taker{}, nil) {
						hold(k)
					}
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(50))*time.Microsecond)
				tk, err := table.Take(cctx, k, owner, taker{}, nil)
				if err == nil && tk != nil {
					err = table.Wait(cctx, k, tk)
				}
				if err == nil {
					hold(k)
				} else if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("a wait that timed out: %v, want context.DeadlineExceeded", err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if n := table.Size(); n != 0 {
		t.Errorf("%d entries left after all locks were released", n)
	}
	if table.Unlock(1, "nobody") {
		t.Error("unlock by a non-holder succeeded")
	}
}

// Waiters are handed a key in the order they queued, each with its own
// call site, and the holder's count stacks.
func TestTableHandsOverInQueueOrder(t *testing.T) {
	var table Table[string, taker]
	ctx := context.Background()
	var site callsite.Stack
	site.Capture()
	for range 2 {
		if tk, err := table.Take(ctx, "k", "holder", taker{}, &site); tk != nil || err != nil {
			t.Fatalf("taking a free key (or one held by the owner): %v, %v", tk, err)
		}
	}
	if h, ok := table.Holder("k"); !ok || h.Owner != "holder" || !h.Site.Recorded() {
		t.Fatalf("holder %+v, %v", h, ok)
	}
	var order []int
	var mu sync.Mutex
	done := make([]chan struct{}, 3)
	for i := range done {
		owner := fmt.Sprint("waiter", i)
		tk, err := table.Take(ctx, "k", owner, taker{hint: "unused"}, nil)
		if tk == nil || err != nil {
			t.Fatalf("waiter %d was not queued: %v", i, err)
		}
		if tk.Hint() != "" {
			t.Errorf("waiter %d has hint %q for a wait that is no self-wait", i, tk.Hint())
		}
		done[i] = make(chan struct{})
		go func() {
			defer close(done[i])
			if err := table.Wait(ctx, "k", tk); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			table.Unlock("k", owner)
		}()
	}
	entries := table.Entries()
	if len(entries) != 1 || len(entries[0].Waiters) != 3 || entries[0].Waiters[0] != "waiter0" {
		t.Fatalf("entries %+v, want one key with three waiters", entries)
	}
	var waits []Waiting
	table.Waits(func(key string, h Holder[taker], w Waiting) {
		if key != "k" || h.Owner != "holder" {
			t.Errorf("a wait for %q held by %v", key, h.Owner)
		}
		waits = append(waits, w)
	})
	if len(waits) != 3 {
		t.Fatalf("%d waits, want 3", len(waits))
	}
	table.EachHeld(func(key string, e *Hold[taker]) bool {
		if e.Owner() != "holder" || e.Count() != 2 || e.Waiters() != 3 || e.Since().IsZero() || !e.Site().Recorded() {
			t.Errorf("held %q: owner %v count %d waiters %d", key, e.Owner(), e.Count(), e.Waiters())
		}
		return true
	})
	if !table.Unlock("k", "holder") {
		t.Fatal("the holder could not release its first hold")
	}
	if h, _ := table.Holder("k"); h.Owner != "holder" {
		t.Fatalf("after one of two releases the key is held by %v", h.Owner)
	}
	table.Unlock("k", "holder")
	for i := range done {
		waitDone(t, done[i], fmt.Sprint("waiter ", i))
	}
	if fmt.Sprint(order) != "[0 1 2]" {
		t.Errorf("handed over in order %v, want [0 1 2]", order)
	}
	if n := table.Size(); n != 0 {
		t.Errorf("%d entries left", n)
	}
}

// A wait its holder's Taker is certain about is refused without queuing;
// a likely one queues with the hint, which its error carries with the
// holder when its context ends.
func TestTableSelfWaits(t *testing.T) {
	var table Table[int, taker]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	table.Take(ctx, 1, "tx", taker{ctx: ctx, self: true}, nil)
	tk, err := table.Take(ctx, 1, "other", taker{}, nil)
	var we *WaitError[taker]
	if tk != nil || !errors.Is(err, ErrSelfWait) || !errors.As(err, &we) || !we.Self || we.Holder.Owner != "tx" {
		t.Fatalf("a certain self-wait: %v, %v; want a refusal naming the holder", tk, err)
	}
	if tk, err := table.Take(context.Background(), 1, "other", taker{}, nil); tk == nil || err != nil {
		t.Fatalf("a wait with another context: %v, %v; want it queued", tk, err)
	} else {
		go table.Unlock(1, "tx")
		if err := table.Wait(context.Background(), 1, tk); err != nil {
			t.Fatal(err)
		}
		table.Unlock(1, "other")
	}

	table.Take(ctx, 2, "lock", taker{ctx: ctx, hint: "likely"}, nil)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	tk, err = table.Take(ctx, 2, "other", taker{}, nil)
	if tk == nil || err != nil || tk.Hint() != "likely" {
		t.Fatalf("a likely self-wait: %v, %v; want it queued with its hint", tk, err)
	}
	wcancel()
	err = table.Wait(wctx, 2, tk)
	if !errors.Is(err, context.Canceled) || !errors.As(err, &we) || we.Self || we.Hint != "likely" || we.Holder.Owner != "lock" || we.Waited <= 0 {
		t.Fatalf("a cancelled wait: %v (%+v)", err, we)
	}
	if e := table.Entries(); len(e) != 1 || len(e[0].Waiters) != 0 {
		t.Errorf("entries after the cancelled wait: %+v", e)
	}
	table.Unlock(2, "lock")
	if n := table.Size(); n != 0 {
		t.Errorf("%d entries left", n)
	}
}

// A key handed over to another owner is released by that owner only; the
// hold keeps its count.
func TestTableHandOver(t *testing.T) {
	var table Table[int, taker]
	table.TryTake(1, "a", taker{}, nil)
	table.TryTake(1, "a", taker{}, nil)
	if table.HandOver(1, "b", "c") || table.HandOver(2, "a", "c") {
		t.Fatal("a key handed over by a non-holder")
	}
	if !table.HandOver(1, "a", "b") {
		t.Fatal("the holder could not hand its key over")
	}
	if table.Unlock(1, "a") {
		t.Fatal("the former holder released the key")
	}
	var counts []int
	table.Held(func(_ int, h Holder[taker], n int) {
		if h.Owner != "b" {
			t.Errorf("held by %v, want b", h.Owner)
		}
		counts = append(counts, n)
	})
	if fmt.Sprint(counts) != "[2]" {
		t.Fatalf("held counts %v, want [2]", counts)
	}
	if !table.Unlock(1, "b") || !table.Unlock(1, "b") || table.Unlock(1, "b") {
		t.Fatal("the new holder's two holds")
	}
	if n := table.Size(); n != 0 {
		t.Errorf("%d entries left", n)
	}
}

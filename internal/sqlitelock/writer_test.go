package sqlitelock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// take takes w for owner or fails the test (it must be free).
func take(t *testing.T, w *Writer[taker], owner any, tk taker, stmt string) {
	t.Helper()
	if q, h, self := w.Take(context.Background(), owner, tk, stmt); q != nil || self {
		t.Fatalf("the writer lock is held by %v", h.Owner)
	}
}

// An uncontended transaction records where it began only within siteWindow
// of the last wait (or always, where a capture is cheap); a statement never.
func TestWriterRecordsSitesAfterRecentWaits(t *testing.T) {
	var w Writer[taker]
	whereAfterLock := func(lastWait time.Time, stmt string) WriterHolder[taker] {
		t.Helper()
		w.mu.Lock()
		w.contended = lastWait
		w.mu.Unlock()
		take(t, &w, 1, taker{}, stmt)
		defer w.Unlock()
		h, _ := w.Holder()
		return h
	}
	for _, c := range []struct {
		name     string
		lastWait time.Time
		recorded bool
	}{
		{"never", time.Time{}, false},
		{"long ago", time.Now().Add(-siteWindow - time.Second), false},
		{"just now", time.Now(), true},
	} {
		h := whereAfterLock(c.lastWait, "")
		where := h.Site.String()
		if recorded := strings.Contains(where, "_test.go:"); recorded != (c.recorded || callsite.FastCapture) {
			t.Errorf("last wait %s: the holder's site is %q, recorded %v, want %v", c.name, where, recorded, c.recorded)
		}
		if h := whereAfterLock(c.lastWait, "INSERT INTO t VALUES (1)"); h.Site.Recorded() || h.Stmt == "" {
			t.Errorf("last wait %s: a statement holds the lock with site %q, statement %q", c.name, h.Site.String(), h.Stmt)
		}
	}
	if _, held := w.Holder(); held {
		t.Error("the writer lock is still held")
	}
}

// Writers are handed the lock in the order they queued; one whose timeout
// or context ends first leaves the queue, told who holds the lock.
func TestWriterQueueTimeoutAndCancel(t *testing.T) {
	var w Writer[taker]
	take(t, &w, "holder", taker{}, "INSERT INTO big VALUES (1)")
	ctx := context.Background()
	var order []int
	var mu sync.Mutex
	done := make([]chan struct{}, 2)
	for i := range done {
		tk, h, self := w.Take(ctx, i, taker{}, "")
		if tk == nil || self || h.Owner != "holder" || h.Stmt != "INSERT INTO big VALUES (1)" {
			t.Fatalf("writer %d: queued %v, self %v, holder %+v", i, tk != nil, self, h)
		}
		if !tk.Site().Recorded() || tk.Since().IsZero() {
			t.Errorf("writer %d: a queued transaction records where it begins and since when", i)
		}
		done[i] = make(chan struct{})
		go func() {
			defer close(done[i])
			if _, err := w.Wait(ctx, tk, 0); err != nil {
				t.Errorf("writer %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			w.Unlock()
		}()
	}
	if w.LastWait().IsZero() {
		t.Error("no wait recorded")
	}

	// A third writer times out, a fourth is cancelled: both leave the queue.
	tk, _, _ := w.Take(ctx, "late", taker{}, "UPDATE t SET x = 1")
	h, err := w.Wait(ctx, tk, 10*time.Millisecond)
	if !errors.Is(err, ErrTimeout) || h.Owner != "holder" {
		t.Fatalf("a wait past its timeout: %v, holder %v", err, h.Owner)
	}
	cctx, cancel := context.WithCancel(ctx)
	tk, _, _ = w.Take(cctx, "cancelled", taker{}, "")
	cancel()
	if h, err := w.Wait(cctx, tk, time.Minute); !errors.Is(err, context.Canceled) || h.Owner != "holder" {
		t.Fatalf("a cancelled wait: %v, holder %v", err, h.Owner)
	}
	var waiting []any
	w.Waits(func(h WriterHolder[taker], x WriterWaiting) {
		if h.Owner != "holder" {
			t.Errorf("a waiter of a lock held by %v", h.Owner)
		}
		waiting = append(waiting, x.Owner)
	})
	if fmt.Sprint(waiting) != "[0 1]" || w.Waiting() != 2 {
		t.Fatalf("waiting %v (%d), want [0 1]", waiting, w.Waiting())
	}

	w.Unlock()
	for i := range done {
		waitDone(t, done[i], fmt.Sprint("writer ", i))
	}
	if fmt.Sprint(order) != "[0 1]" {
		t.Errorf("handed over in order %v, want [0 1]", order)
	}
	if _, held := w.Holder(); held || w.Waiting() != 0 {
		t.Error("the writer lock is still held or waited for")
	}
}

// A writer whose wait its holder's Taker is certain about is refused
// without queuing; a likely one queues with the hint.
func TestWriterSelfWaits(t *testing.T) {
	var w Writer[taker]
	ctx := context.Background()
	take(t, &w, "tx", taker{ctx: ctx, self: true}, "")
	tk, h, self := w.Take(ctx, "stmt", taker{}, "INSERT INTO t VALUES (1)")
	if tk != nil || !self || h.Owner != "tx" || w.Waiting() != 0 {
		t.Fatalf("a certain self-wait: queued %v, self %v, holder %v, %d waiting", tk != nil, self, h.Owner, w.Waiting())
	}
	w.Unlock()

	take(t, &w, "tx", taker{ctx: ctx, hint: "likely"}, "")
	tk, _, self = w.Take(ctx, "stmt", taker{}, "INSERT INTO t VALUES (1)")
	if tk == nil || self || tk.Hint() != "likely" {
		t.Fatalf("a likely self-wait: queued %v, self %v", tk != nil, self)
	}
	w.Unlock()
	if _, err := w.Wait(ctx, tk, time.Minute); err != nil {
		t.Fatal(err)
	}
	if h, _ := w.Holder(); h.Owner != "stmt" || h.Stmt == "" {
		t.Errorf("the lock was handed to %v (%q)", h.Owner, h.Stmt)
	}
	w.Unlock()
}

// A writer that waits for a transaction whose site was not recorded asks
// for it; the holder's next statement records where it runs, and only the
// holder's.
func TestWriterHolderSiteAtNextStatement(t *testing.T) {
	var w Writer[taker]
	take(t, &w, "tx", taker{}, "")
	w.mu.Lock()
	w.site.Reset() // as where a capture is not cheap and writers have not waited
	w.mu.Unlock()
	w.NoteStatementInTx("tx")
	if w.SiteWanted() {
		t.Fatal("a site wanted before anybody waited")
	}
	tk, _, _ := w.Take(context.Background(), "waiter", taker{}, "")
	if !w.SiteWanted() {
		t.Fatal("the waiter did not ask for the holder's site")
	}
	w.NoteStatementInTx("waiter")
	if h, _ := w.Holder(); h.Site.Recorded() {
		t.Fatal("another owner's statement recorded the holder's site")
	}
	w.NoteStatementInTx("tx")
	h, _ := w.Holder()
	if !strings.Contains(h.Site.String(), "_test.go:") || !h.SiteLate || w.SiteWanted() {
		t.Fatalf("the holder's site after its next statement: %q (later %v), still wanted %v", h.Site.String(), h.SiteLate, w.SiteWanted())
	}
	w.Unlock()
	if _, err := w.Wait(context.Background(), tk, time.Minute); err != nil {
		t.Fatal(err)
	}
	if h, _ := w.Holder(); h.SiteLate || h.Owner != "waiter" {
		t.Errorf("the next holder %v inherited the site of a later statement", h.Owner)
	}
	w.Unlock()
}

// Writers with random timeouts and cancellations hold the lock one at a
// time, and leave it free and unqueued.
func TestWriterExcludesUnderContention(t *testing.T) {
	var w Writer[taker]
	var holders atomic.Int32
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for range 2000 / 8 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(100))*time.Microsecond)
				stmt := ""
				if r.IntN(2) == 0 {
					stmt = "INSERT"
				}
				tk, _, self := w.Take(ctx, g, taker{}, stmt)
				var err error
				if self {
					err = errors.New("a self-wait without a self-waiting taker")
				} else if tk != nil {
					_, err = w.Wait(ctx, tk, time.Duration(r.IntN(100))*time.Microsecond)
				}
				if err == nil {
					if n := holders.Add(1); n != 1 {
						t.Errorf("%d writers hold the writer lock", n)
					}
					holders.Add(-1)
					w.Unlock()
				} else if !errors.Is(err, ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("writer %d: %v", g, err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if _, held := w.Holder(); held || w.Waiting() != 0 || w.SiteWanted() {
		t.Error("the writer lock is left held, waited for, or asking for a site")
	}
}

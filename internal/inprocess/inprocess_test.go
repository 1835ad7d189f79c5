package inprocess

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/lockset"
)

// owners names the test's owners (ints) as connections; other owners name
// none.
func owners(owner any) holders.Holder {
	if n, ok := owner.(int); ok {
		return holders.Holder{Database: "orders", Conn: uint64(n), PID: int32(100 + n)}
	}
	return holders.Holder{}
}

// taker is a taker on another goroutine's call chain than any wait's.
func taker() Taker { return Taker{Hint: HintLock} }

// waitUntil polls cond until it holds (the state it waits for is set by
// another goroutine), failing the test after ten seconds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A wait cut by its context names the holder and how long it waited,
// wrapping the context's error; a holder gone meanwhile is not named.
func TestExplainWaitNamesTheHolder(t *testing.T) {
	var tab Table[int64]
	var site callsite.Stack
	site.Capture()
	if !tab.TryLock(7, 1, taker(), &site) || tab.TryLock(7, 2, taker(), nil) {
		t.Fatal("TryLock: the first takes, the second does not")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := tab.Lock(ctx, 7, 2, taker(), nil, nil)
	err = Owners(owners).ExplainWait(err, "AcquireAdvisoryLock(7)", "advisory lock 7", "key 7")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "AcquireAdvisoryLock(7) gave up waiting for advisory lock 7 after") ||
		!strings.Contains(err.Error(), `it is held by connection #1 of "orders" (backend pid 101), which took it at `) {
		t.Errorf("timed out: %v", err)
	}
	h, ok := tab.Holder(7)
	if !ok || h.Owner != 1 || !h.Site.Recorded() || tab.Size() != 1 {
		t.Errorf("holder %+v, %v; size %d", h, ok, tab.Size())
	}
	if !tab.HandOver(7, 1, 3) || tab.HandOver(7, 1, 3) || !tab.Unlock(7, 3) || tab.Unlock(7, 3) || tab.Size() != 0 {
		t.Error("HandOver and Unlock: once each, by the holder")
	}
	if plain := errors.New("other"); Owners(owners).ExplainWait(plain, "w", "x", "k") != plain {
		t.Error("an error of another kind changed")
	}
}

// A wait for a holder on the waiter's own call chain, certainly (the
// transaction of RunInTx's fn running on this goroutine), is refused with
// ErrSelfWait at once.
func TestSelfWaitIsRefused(t *testing.T) {
	var tab Table[string]
	ctx := context.Background()
	var run callsite.Run
	run.Here()
	run.SetRunning(true)
	defer run.SetRunning(false)
	if !tab.TryLock("k", 1, Taker{Chain: callsite.ChainOf(ctx, &run), Hint: HintTx}, nil) {
		t.Fatal("TryLock")
	}
	err := tab.Lock(ctx, "k", 2, taker(), nil, nil)
	err = Owners(owners).ExplainWait(err, "Lock(ns, k)", "lockset id k", "ns / k")
	if !errors.Is(err, ErrSelfWait) || !strings.Contains(err.Error(), "Lock(ns, k) would wait for lockset id k, which connection #1") {
		t.Errorf("self-wait: %v", err)
	}
}

// hintNoted records the hint a wait is given.
type hintNoted struct{ hint string }

func (h *hintNoted) NoteSelfHint(hint string) { h.hint = hint }

// Edges lists who waits for whom, oldest first: a table's waiter, a turn
// whose owner waits on the server itself left out, a lockset id named by
// its namespace, the writer lock's waiter; its hints of likely self-waits
// reach the waiter's record.
func TestEdgesListWhoWaitsForWhom(t *testing.T) {
	var named, turns Table[int64]
	var sets Table[LocksetKey]
	var writer Writer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	id := lockset.IntID(42)
	named.TryLock(1, 1, taker(), nil)
	turns.TryLock(2, 3, taker(), nil)
	turns.TryLock(3, 5, taker(), nil)
	sets.TryLock(LocksetKey{Namespace: "accounts", ID: id}, 7, taker(), nil)
	likely := Taker{Chain: callsite.ChainOf(ctx, nil), Hint: HintTx}
	if !writer.TryTake(9, &likely, "") {
		t.Fatal("writer TryTake")
	}
	done := make(chan struct{}, 5)
	wait := func(f func()) {
		go func() { f(); done <- struct{}{} }()
	}
	var noted hintNoted
	wait(func() { named.Lock(ctx, 1, 2, taker(), nil, nil) })
	waitUntil(t, "the advisory waiter queued", func() bool { return len(named.Entries()[0].Waiters) == 1 })
	wait(func() { turns.Lock(ctx, 2, 4, taker(), nil, nil) })
	wait(func() { turns.Lock(ctx, 3, 6, taker(), nil, nil) })
	waitUntil(t, "the turns' waiters queued", func() bool {
		n := 0
		for _, e := range turns.Entries() {
			n += len(e.Waiters)
		}
		return n == 2
	})
	wait(func() { sets.Lock(ctx, LocksetKey{Namespace: "accounts", ID: id}, 8, taker(), nil, nil) })
	waitUntil(t, "the lockset waiter queued", func() bool { return len(sets.Entries()[0].Waiters) == 1 })
	tk, _, _ := writer.Take(ctx, 10, likely, "") // on the holder's goroutine, with its context: a likely self-wait
	if tk == nil {
		t.Fatal("writer Take did not queue")
	}
	noted.NoteSelfHint(tk.Hint())
	wait(func() { writer.Wait(ctx, tk, 0) })
	waitUntil(t, "the writer's waiter queued", func() bool { return writer.Waiting() == 1 })

	tables := Tables{Named: &named, Turns: &turns, Locksets: &sets, Writer: &writer,
		AwaitsOnServer: func(owner any, key int64) bool { return owner == 5 && key == 3 },
		DescribeKey:    func(k int64) string { return "key " + strconv.FormatInt(k, 10) }}
	var got []string
	for _, e := range tables.Edges(owners) {
		got = append(got, e.Kind+" "+owners(e.Waiter).Who()+" -> "+e.Holder.Key+" "+e.Holder.Who())
	}
	want := []string{
		`advisory connection #2 of "orders" (backend pid 102) -> key 1 connection #1 of "orders" (backend pid 101)`,
		`advisory connection #4 of "orders" (backend pid 104) -> key 2 connection #3 of "orders" (backend pid 103)`,
		`lockset connection #8 of "orders" (backend pid 108) -> accounts / 42 connection #7 of "orders" (backend pid 107)`,
		`sqlite_writer connection #10 of "orders" (backend pid 110) -> writer connection #9 of "orders" (backend pid 109)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("edges:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	cancel()
	for range 5 {
		<-done
	}
	if noted.hint != HintTx {
		t.Errorf("the writer waiter's hint: %q", noted.hint)
	}
}

// The writer lock's holder: a statement names itself, a transaction its
// call site, or says that none was recorded.
func TestWriterHolder(t *testing.T) {
	var w Writer
	tk := taker()
	w.TryTake(1, &tk, "INSERT INTO jobs VALUES (1)")
	h, ok := WriterHolderOf(&w)
	if !ok || h.Location() != `statement "INSERT INTO jobs VALUES (1)"` || !h.Identity(owners).Running || !strings.Contains(h.Describe(owners), "INSERT INTO jobs") {
		t.Errorf("a statement's hold: %q, %+v", h.Location(), h.Identity(owners))
	}
	w.Unlock()
	w.TryTake(2, &tk, "")
	h, _ = WriterHolderOf(&w)
	if loc := h.Location(); (loc == "not recorded") != strings.Contains(h.Describe(owners), "in a transaction whose call site was not recorded") || !strings.Contains(h.Describe(owners), "connection #2") {
		t.Errorf("a transaction's hold: %q, %q", h.Location(), h.Describe(owners))
	}
	w.Unlock()
	if _, ok := WriterHolderOf(&w); ok {
		t.Error("still held")
	}
}

// Call sites are named once per list; unrecorded ones are "unknown".
func TestSiteNamesAndKeyNames(t *testing.T) {
	n := SiteNames{}
	var s, none callsite.Stack
	s.Capture()
	if a, b := n.Of(&s), n.Of(&s); a != b || len(n) != 1 || a == "unknown" || !strings.Contains(a, ".go:") {
		t.Errorf("site %q, %q (%d named)", a, b, len(n))
	}
	if n.Of(&none) != "unknown" {
		t.Error("an unrecorded site")
	}
	if KeyName("accounts", "42") != "accounts / 42" || KeyName("", "key 7") != "key 7" {
		t.Error("KeyName")
	}
}

package holding

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
)

type key = advisorykey.Key

// testLocks is a connection's session locks as the session-lock machine
// would keep them.
type testLocks struct {
	mu     sync.Mutex
	locked bool // read by the methods: they are called under the mutex
	times  int  // how many times the mutex was taken
	held   map[key]time.Time
	xact   map[key]bool
}

func (l *testLocks) Lock()   { l.mu.Lock(); l.locked = true; l.times++ }
func (l *testLocks) Unlock() { l.locked = false; l.mu.Unlock() }

func (l *testLocks) TookLocked(k key) (string, time.Time, trace.SpanContext, bool) {
	if !l.locked {
		panic("TookLocked outside the lock")
	}
	since, ok := l.held[k]
	return "jobs.go:7", since, trace.SpanContext{}, ok
}

func (l *testLocks) HoldsXactLocked(k key) bool {
	if !l.locked {
		panic("HoldsXactLocked outside the lock")
	}
	return l.xact[k]
}

// testConn is a connection of database "orders"; locks is nil on a
// database that tracks no session locks.
type testConn struct {
	id    uint64
	locks *testLocks
	tx    Tx
	run   *callsite.Run
}

func (c *testConn) Identity() holders.Holder {
	return holders.Holder{Database: "orders", Conn: c.id, PID: int32(100 + c.id)}
}

func (c *testConn) Locks() Locks[key] {
	if c.locks == nil {
		return nil
	}
	return c.locks
}

func (c *testConn) Transaction() *Tx   { return &c.tx }
func (c *testConn) Run() *callsite.Run { return c.run }
func newConn(id uint64) *testConn {
	return &testConn{id: id, locks: &testLocks{held: map[key]time.Time{}, xact: map[key]bool{}}}
}
func conns(cs ...*testConn) map[*testConn]struct{} {
	m := map[*testConn]struct{}{}
	for _, c := range cs {
		m[c] = struct{}{}
	}
	return m
}

func TestConflicting(t *testing.T) {
	ex, sh := key{K1: 7}, key{K1: 7, Shared: true}
	if got := Conflicting(ex); !slices.Equal(got, []key{ex, sh}) {
		t.Errorf("an exclusive request conflicts with both modes: %v", got)
	}
	if got := Conflicting(sh); !slices.Equal(got, []key{ex}) {
		t.Errorf("a shared request conflicts with the exclusive mode only: %v", got)
	}
}

// A connection is named by the session lock it holds among the keys, else
// by its open transaction, else by its identity alone.
func TestOf(t *testing.T) {
	c := newConn(2)
	since := time.Now().Add(-time.Minute)
	c.locks.held[key{K1: 7, Shared: true}] = since

	h := Of(c, []key{{K1: 9}, {K1: 7}})
	if h.SiteKind != holders.SiteTook || h.Key != (key{K1: 7, Shared: true}).String() || h.Site != "jobs.go:7" || !h.Since.Equal(since) || h.Conn != 2 || h.PID != 102 {
		t.Errorf("holder of a conflicting session lock: %+v", h)
	}
	if c.locks.times != 1 {
		t.Errorf("the connection's locks were read under %d holds of its mutex, want one for all keys", c.locks.times)
	}
	c.locks.held[key{K1: 7}] = since.Add(time.Second)
	if h := Of(c, []key{{K1: 7}}); h.Key != (key{K1: 7}).String() {
		t.Errorf("of the two modes held, the exclusive one is found first: %+v", h)
	}
	delete(c.locks.held, key{K1: 7})
	if h := Of(c, []key{{K1: 7, Shared: true}}); h.SiteKind != holders.SiteNone || h.Conn != 2 {
		t.Errorf("a shared request does not conflict with a shared lock: %+v", h)
	}

	var site callsite.Stack
	site.Capture()
	began := time.Now().Add(-time.Second)
	c.tx.Began(context.Background(), began, &site)
	if h := Of(c, []key{{K1: 8}}); h.SiteKind != holders.SiteBegan || !h.Since.Equal(began) || h.Site == "" {
		t.Errorf("holder by its open transaction: %+v", h)
	}
	if h := Of(c, []key{{K1: 7}}); h.SiteKind != holders.SiteTook {
		t.Errorf("a lock held names the holder before its transaction: %+v", h)
	}
	c.tx.Ended()
	if h := Of(c, []key(nil)); h.SiteKind != holders.SiteNone || h.Since != (time.Time{}) {
		t.Errorf("identity alone: %+v", h)
	}
	sqlite := &testConn{id: 3}
	sqlite.tx.Began(context.Background(), began, nil)
	if h := Of(sqlite, []key{{K1: 7}}); h.SiteKind != holders.SiteBegan || h.Site != "" {
		t.Errorf("no session locks tracked, a transaction without a site: %+v", h)
	}
}

func TestAmongAndHeldAmong(t *testing.T) {
	a, b, c, sqlite := newConn(1), newConn(2), newConn(3), &testConn{id: 4}
	a.locks.held[key{K1: 7}] = time.Now()
	b.locks.held[key{K1: 7, Shared: true}] = time.Now()
	c.locks.xact[key{K1: 7}] = true

	got := Among([]*testConn{a, b, c, sqlite}, key{K1: 7}, a)
	if len(got) != 1 || got[0].Conn != 2 || got[0].SiteKind != holders.SiteTook || got[0].Key != (key{K1: 7, Shared: true}).String() ||
		got[0].Site != "jobs.go:7" || !got[0].Since.Equal(b.locks.held[key{K1: 7, Shared: true}]) {
		t.Errorf("others holding 7 in session: %+v", got)
	}
	if got := Among([]*testConn{a, b}, key{K1: 7, Shared: true}, nil); len(got) != 1 || got[0].Conn != 1 {
		t.Errorf("a shared request is held up by the exclusive holder only: %+v", got)
	}
	if k, ok := HeldAmong(c, []key{{K1: 9}, {K1: 7, Shared: true}}); !ok || k != (key{K1: 7}) {
		t.Errorf("a transaction-level lock counts: %v %v", k, ok)
	}
	if _, ok := HeldAmong(b, []key{{K1: 7, Shared: true}}); ok {
		t.Error("shared does not conflict with shared")
	}
	if k, ok := HeldAmong(b, []key{{K1: 7}}); !ok || k != (key{K1: 7, Shared: true}) {
		t.Errorf("a session lock counts: %v %v", k, ok)
	}
	b.locks.xact[key{K1: 9}] = true
	if k, ok := HeldAmong(b, []key{{K1: 7}, {K1: 9}}); !ok || k != (key{K1: 9}) {
		t.Errorf("the last of the keys held is the one named: %v %v", k, ok)
	}
	if _, ok := HeldAmong(sqlite, []key{{K1: 7}}); ok {
		t.Error("no session locks tracked")
	}
}

// A transaction this goroutine began with the waiter's context is likely
// its own; RunInTx's fn running here makes it certain; another
// goroutine's or another context's is neither.
func TestSelfWait(t *testing.T) {
	if callsite.CurrentGoroutine() == 0 {
		t.Skip("goroutines cannot be told apart on this architecture")
	}
	type caller struct{}
	ctx := context.WithValue(context.Background(), caller{}, "caller")
	self, a, b := newConn(1), newConn(2), newConn(3)
	if _, found, _ := SelfWait(ctx, self, conns(self, a, b)); found {
		t.Fatal("no transaction open")
	}
	self.tx.Began(ctx, time.Now(), nil)
	done := make(chan struct{})
	go func() { b.tx.Began(ctx, time.Now(), nil); close(done) }()
	<-done
	if _, found, _ := SelfWait(ctx, self, conns(self, a, b)); found {
		t.Fatal("the waiter's own transaction, or another goroutine's, is no self-wait")
	}
	a.tx.Began(context.Background(), time.Now(), nil)
	if _, found, _ := SelfWait(ctx, self, conns(self, a, b)); found {
		t.Fatal("another context is no self-wait")
	}
	a.tx.Began(ctx, time.Now(), nil)
	if h, found, certain := SelfWait(ctx, self, conns(self, a, b)); !found || certain || h != a {
		t.Fatalf("likely: %v %v %v", h, found, certain)
	}
	var run callsite.Run
	run.Here()
	run.SetRunning(true)
	b.run = &run
	if h, found, certain := SelfWait(ctx, self, conns(self, a, b)); !found || !certain || h != b {
		t.Fatalf("certain: %v %v %v", h, found, certain)
	}
	b.run = nil
	self.run = &run
	if h, found, certain := SelfWait(ctx, self, conns(self, a, b)); !found || certain || h != a {
		t.Fatalf("the waiter's own fn running is no holder: %v %v %v", h, found, certain)
	}
	run.SetRunning(false)
	a.tx.Ended()
	if _, found, _ := SelfWait(ctx, self, conns(self, a, b)); found {
		t.Fatal("ended, and fn no longer running")
	}
}

package debugpage

import (
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
)

// The debug page's gathering is bounded at any scale: a transaction that
// holds 200,000 lockset ids, or thousands of waiters, costs a page load a
// pass over the lock tables (no allocation per lock) and memory for the
// rows it shows, never a copy of everything. Held locks are grouped by
// kind and namespace and counted; each group keeps its top rows (the locks
// others wait for, then the oldest); the rest are one JSON page away
// (?format=json&db=…&kind=…&namespace=…, in key order, PageLimit
// rows a page, resumed with &after=…).

// Bounds of one page load.
const (
	RowsPerGroup = 20   // held rows kept per (kind, namespace) group
	maxGroups    = 200  // groups with rows; locks of further namespaces are only counted
	MaxWaiters   = 500  // waits in progress listed in detail (all are counted)
	PageLimit    = 5000 // held rows per JSON page at most (?limit=)
	// ScanLimit bounds the locks one page load looks at (a few tens
	// of milliseconds under the lock tables' mutexes); past it the counts
	// are partial, and the page says so.
	ScanLimit = 1_000_000
)

// Candidate is one held lock as the gathering meets it, under the lock
// tables' mutexes: nothing copied beyond a few words, nothing formatted
// or symbolised (that is done for the rows kept only).
type Candidate struct {
	Kind, Mode, Scope, State string
	Namespace                string
	ID                       string          // the lockset id, canonical ("" for an advisory key)
	Key                      advisorykey.Key // the Postgres advisory key (Advisory true)
	Advisory                 bool
	Conn                     uint64
	PID                      int32
	Since                    time.Time
	Site                     string
	Stack                    *callsite.Stack // when Site is "": the stack, copied and symbolised only if the row is kept
	Statement                string
	Count                    int
	Waiters                  int // waits in progress for this lock
}

// Names is what the page asks of the caller to show the rows it keeps
// (only those: a page load names at most a few hundred) and to order
// lockset ids: how ids are encoded, what advisory keys were made from,
// where a stack was called from.
type Names interface {
	// Site names a recorded stack: the application's file:line.
	Site(s *callsite.Stack) string
	// ID is a canonical lockset id as a reader reads it.
	ID(cid string) string
	// StringID returns the text of a canonical lockset id that is a
	// string (ordered with its digit runs as numbers); ok is false for an
	// id of another type.
	StringID(cid string) (text string, ok bool)
	// KeyName returns the name a bigint advisory key was made from, when
	// it is known.
	KeyName(k1 int64) (name string, ok bool)
}

// heldPos is a held lock's place in key order, the order of JSON pages.
type heldPos struct {
	cid    string
	k1, k2 int64
	shared bool
	conn   uint64
}

func (c *Candidate) pos() heldPos {
	return heldPos{cid: c.ID, k1: c.Key.K1, k2: c.Key.K2, shared: c.Key.Shared, conn: c.Conn}
}

// comparePos orders held locks: lockset ids in lock order (integers
// numerically, strings with their digit runs compared as numbers, so
// "id-2" comes before "id-10"), then advisory keys, then connections.
func comparePos(names Names, a, b heldPos) int {
	if a.cid != b.cid {
		if ta, ok := names.StringID(a.cid); ok {
			if tb, ok := names.StringID(b.cid); ok {
				if c := naturalCompare(ta, tb); c != 0 {
					return c
				}
			}
		}
		return strings.Compare(a.cid, b.cid)
	}
	switch {
	case a.k1 != b.k1:
		return cmpInt(a.k1, b.k1)
	case a.k2 != b.k2:
		return cmpInt(a.k2, b.k2)
	case a.shared != b.shared:
		if a.shared {
			return 1
		}
		return -1
	}
	return cmpInt(int64(a.conn), int64(b.conn))
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// naturalCompare compares strings with runs of ASCII digits compared by
// value; equal values of different spelling ("01", "1") compare equal here.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			da, db := digitRun(a), digitRun(b)
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return cmpInt(int64(len(na)), int64(len(nb)))
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmpInt(int64(a[0]), int64(b[0]))
		}
		a, b = a[1:], b[1:]
	}
	return cmpInt(int64(len(a)), int64(len(b)))
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func digitRun(s string) int {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}

// moreImportant ranks the rows a page shows: locks others wait for (most
// waiters first), then the oldest, then key order.
func moreImportant(names Names, a, b *Candidate) bool {
	if a.Waiters != b.Waiters {
		return a.Waiters > b.Waiters
	}
	if !a.Since.Equal(b.Since) {
		switch {
		case a.Since.IsZero():
			return false
		case b.Since.IsZero():
			return true
		}
		return a.Since.Before(b.Since)
	}
	return comparePos(names, a.pos(), b.pos()) < 0
}

// keptHeld is a candidate kept as a row, with its own copy of the stack.
type keptHeld struct {
	Candidate
	stack callsite.Stack
}

// heldTop keeps the n best candidates offered, in O(n) memory: a heap
// whose root is the worst one kept. The best are the most important
// (moreImportant), or the first in key order (the rows of a JSON page).
type heldTop struct {
	n        int
	keyOrder bool
	names    Names
	items    []keptHeld
}

// better ranks a before b.
func (t *heldTop) better(a, b *Candidate) bool {
	if t.keyOrder {
		return comparePos(t.names, a.pos(), b.pos()) < 0
	}
	return moreImportant(t.names, a, b)
}

// offer keeps *x if it is among the n best so far; it copies *x (and its
// stack) only then.
func (t *heldTop) offer(x *Candidate) {
	if t.n <= 0 || len(t.items) == t.n && !t.better(x, &t.items[0].Candidate) {
		return
	}
	k := keptHeld{Candidate: *x}
	if x.Stack != nil {
		k.stack = *x.Stack
	}
	k.Stack = nil
	if len(t.items) < t.n {
		t.items = append(t.items, k)
		for i := len(t.items) - 1; i > 0; {
			p := (i - 1) / 2
			if !t.better(&t.items[p].Candidate, &t.items[i].Candidate) {
				break
			}
			t.items[p], t.items[i] = t.items[i], t.items[p]
			i = p
		}
		return
	}
	t.items[0] = k
	for i := 0; ; {
		worst := i
		for _, c := range [2]int{2*i + 1, 2*i + 2} {
			if c < len(t.items) && t.better(&t.items[worst].Candidate, &t.items[c].Candidate) {
				worst = c
			}
		}
		if worst == i {
			return
		}
		t.items[i], t.items[worst] = t.items[worst], t.items[i]
		i = worst
	}
}

// sorted returns the candidates kept, best first.
func (t *heldTop) sorted() []keptHeld {
	sort.Slice(t.items, func(i, j int) bool { return t.better(&t.items[i].Candidate, &t.items[j].Candidate) })
	return t.items
}

// heldGroupKey names a group of held locks.
type heldGroupKey struct{ kind, namespace string }

// heldGroup counts one group's locks and keeps its top rows.
type heldGroup struct {
	key     heldGroupKey
	count   int
	waiters int
	byConn  map[uint64]int // locks per holding connection (bounded by the open connections)
	top     heldTop
}

// A Collector is fed every held lock of a database, under the lock
// tables' mutexes: it stays cheap and allocation-free per lock. It keeps
// the top rows of every group for the page, or the rows of one JSON page.
type Collector struct {
	page    *Query // nil: the page's top rows of every group
	names   Names
	groups  map[heldGroupKey]*heldGroup
	order   []*heldGroup
	other   int // locks of groups beyond maxGroups
	total   int
	partial bool // ScanLimit reached: the counts are of the locks looked at
}

// NewCollector returns a collector of the rows of page, or of the page's
// top rows of every group when page is nil; names names the rows kept.
func NewCollector(page *Query, names Names) *Collector {
	return &Collector{page: page, names: names, groups: map[heldGroupKey]*heldGroup{}}
}

// Full reports whether the collector has looked at ScanLimit locks; the
// gathering then stops.
func (hc *Collector) Full() bool {
	if hc.total >= ScanLimit {
		hc.partial = true
		return true
	}
	return false
}

// Total is how many locks the collector was offered.
func (hc *Collector) Total() int { return hc.total }

// Partial reports whether the gathering stopped at ScanLimit: the counts
// are of the locks looked at.
func (hc *Collector) Partial() bool { return hc.partial }

// Offer counts c and keeps it if it is among its group's rows; it copies
// *c only then.
func (hc *Collector) Offer(c *Candidate) {
	hc.total++
	k := heldGroupKey{c.Kind, c.Namespace}
	g := hc.groups[k]
	if g == nil {
		if len(hc.order) >= maxGroups && (hc.page == nil || k != hc.page.group) {
			hc.other++
			return
		}
		g = &heldGroup{key: k, byConn: map[uint64]int{}, top: heldTop{n: RowsPerGroup, names: hc.names}}
		if hc.page != nil {
			g.top = heldTop{keyOrder: true, names: hc.names}
			if k == hc.page.group {
				g.top.n = hc.page.limit + 1 // one more: is there a next page?
			}
		}
		hc.groups[k] = g
		hc.order = append(hc.order, g)
	}
	g.count++
	g.waiters += c.Waiters
	g.byConn[c.Conn]++
	if hc.page != nil && hc.page.hasAfter && comparePos(hc.names, c.pos(), hc.page.after) <= 0 {
		return
	}
	g.top.offer(c)
}

// Rows formats the rows kept, group by group (groups that others wait for
// first, then the largest), and describes the groups, of database db.
func (hc *Collector) Rows(db int, now time.Time) ([]Held, []Group) {
	sort.SliceStable(hc.order, func(i, j int) bool {
		a, b := hc.order[i], hc.order[j]
		if a.waiters != b.waiters {
			return a.waiters > b.waiters
		}
		if a.count != b.count {
			return a.count > b.count
		}
		if a.key.kind != b.key.kind {
			return a.key.kind < b.key.kind
		}
		return a.key.namespace < b.key.namespace
	})
	held := []Held{}
	groups := []Group{}
	for _, g := range hc.order {
		kept := g.top.sorted()
		for i := range kept {
			held = append(held, kept[i].row(now, hc.names))
		}
		groups = append(groups, Group{Kind: g.key.kind, Namespace: g.key.namespace, Count: g.count, Shown: len(kept),
			Waiters: g.waiters, Pages: heldPagesQuery(db, g.key), Holders: g.holders()})
	}
	if hc.other > 0 {
		groups = append(groups, Group{Kind: "other", Count: hc.other, Other: true})
	}
	return held, groups
}

// holders lists the connections holding the group's locks, the most first.
func (g *heldGroup) holders() []GroupHolder {
	out := make([]GroupHolder, 0, len(g.byConn))
	for c, n := range g.byConn {
		out = append(out, GroupHolder{Conn: c, Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Conn < out[j].Conn
	})
	return out[:min(len(out), RowsPerGroup)]
}

// heldPagesQuery is the query string of a group's JSON pages.
func heldPagesQuery(db int, k heldGroupKey) string {
	v := url.Values{"format": {"json"}, "db": {strconv.Itoa(db)}, "kind": {k.kind}}
	if k.namespace != "" {
		v.Set("namespace", k.namespace)
	}
	return "?" + v.Encode()
}

// row formats a kept candidate.
func (c *keptHeld) row(now time.Time, names Names) Held {
	h := Held{Kind: c.Kind, Mode: c.Mode, Scope: c.Scope, Namespace: c.Namespace, Conn: c.Conn, PID: c.PID,
		State: c.State, Since: c.Since, HeldSeconds: SecondsSince(now, c.Since), Site: c.Site,
		Statement: holders.Truncate(c.Statement, 500), Count: c.Count, Waiters: c.Waiters}
	if h.Site == "" && c.stack.Recorded() {
		h.Site = names.Site(&c.stack)
	}
	switch {
	case c.ID != "":
		h.Key = names.ID(c.ID)
		if c.Advisory {
			h.AdvisoryKey = c.Key.Number() // Lock on Postgres
		}
	case c.Advisory:
		h.Key = c.Key.Number()
		if !c.Key.Pair {
			if name, ok := names.KeyName(c.Key.K1); ok {
				h.Name = name
			}
		}
	default:
		h.Key = "writer"
	}
	return h
}

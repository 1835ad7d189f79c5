package lockhooks

import (
	"bytes"
	"encoding/base64"
	"errors"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// The debug page's gathering is bounded at any scale: a transaction that
// holds 200,000 lockset ids, or thousands of waiters, costs a page load a
// pass over the lock tables (no allocation per lock) and memory for the
// rows it shows, never a copy of everything. Held locks are grouped by
// kind and namespace and counted; each group keeps its top rows (the locks
// others wait for, then the oldest); the rest are one JSON page away
// (?format=json&db=…&kind=…&namespace=…, in key order, debugPageLimit
// rows a page, resumed with &after=…).

// Bounds of one page load.
const (
	debugRowsPerGroup = 20   // held rows kept per (kind, namespace) group
	debugMaxGroups    = 200  // groups with rows; locks of further namespaces are only counted
	debugMaxWaiters   = 500  // waits in progress listed in detail (all are counted)
	debugPageLimit    = 5000 // held rows per JSON page at most (?limit=)
	// debugScanLimit bounds the locks one page load looks at (a few tens
	// of milliseconds under the lock tables' mutexes); past it the counts
	// are partial, and the page says so.
	debugScanLimit = 1_000_000
)

// heldCandidate is one held lock as the gathering meets it, under the
// lock tables' mutexes: nothing copied beyond a few words, nothing
// formatted or symbolised (that is done for the rows kept only).
type heldCandidate struct {
	kind, mode, scope, state string
	namespace                string
	cid                      string  // the lockset id, canonical ("" for an advisory key)
	key                      lockKey // the Postgres advisory key (advisory true)
	advisory                 bool
	connID                   uint64
	pid                      int32
	since                    time.Time
	site                     string
	pcs                      *callsite.Stack // when site is "": the stack, copied and symbolised only if the row is kept
	stmt                     string
	count                    int
	waiters                  int // waits in progress for this lock
}

// heldPos is a held lock's place in key order, the order of JSON pages.
type heldPos struct {
	cid    string
	k1, k2 int64
	shared bool
	conn   uint64
}

func (c *heldCandidate) pos() heldPos {
	return heldPos{cid: c.cid, k1: c.key.K1, k2: c.key.K2, shared: c.key.Shared, conn: c.connID}
}

// comparePos orders held locks: lockset ids in lock order (integers
// numerically, strings with their digit runs compared as numbers, so
// "id-2" comes before "id-10"), then advisory keys, then connections.
func comparePos(a, b heldPos) int {
	if a.cid != b.cid {
		if a.cid != "" && b.cid != "" && a.cid[0] == tagString && b.cid[0] == tagString {
			if c := naturalCompare(a.cid[1:], b.cid[1:]); c != 0 {
				return c
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
func moreImportant(a, b *heldCandidate) bool {
	if a.waiters != b.waiters {
		return a.waiters > b.waiters
	}
	if !a.since.Equal(b.since) {
		switch {
		case a.since.IsZero():
			return false
		case b.since.IsZero():
			return true
		}
		return a.since.Before(b.since)
	}
	return comparePos(a.pos(), b.pos()) < 0
}

// inKeyOrder ranks rows of a JSON page.
func inKeyOrder(a, b *heldCandidate) bool { return comparePos(a.pos(), b.pos()) < 0 }

// keptHeld is a candidate kept as a row, with its own copy of the stack.
type keptHeld struct {
	heldCandidate
	stack callsite.Stack
}

// heldTop keeps the n best candidates offered, in O(n) memory: a heap
// whose root is the worst one kept.
type heldTop struct {
	n      int
	better func(a, b *heldCandidate) bool
	items  []keptHeld
}

// offer keeps *x if it is among the n best so far; it copies *x (and its
// stack) only then.
func (t *heldTop) offer(x *heldCandidate) {
	if t.n <= 0 || len(t.items) == t.n && !t.better(x, &t.items[0].heldCandidate) {
		return
	}
	k := keptHeld{heldCandidate: *x}
	if x.pcs != nil {
		k.stack = *x.pcs
	}
	k.pcs = nil
	if len(t.items) < t.n {
		t.items = append(t.items, k)
		for i := len(t.items) - 1; i > 0; {
			p := (i - 1) / 2
			if !t.better(&t.items[p].heldCandidate, &t.items[i].heldCandidate) {
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
			if c < len(t.items) && t.better(&t.items[worst].heldCandidate, &t.items[c].heldCandidate) {
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
	sort.Slice(t.items, func(i, j int) bool { return t.better(&t.items[i].heldCandidate, &t.items[j].heldCandidate) })
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

// heldQuery selects one JSON page of held locks: one group, in key order,
// after a position.
type heldQuery struct {
	db       int
	group    heldGroupKey
	after    heldPos
	hasAfter bool
	limit    int
}

// heldCollector is fed every held lock of a database, under the lock
// tables' mutexes: it must stay cheap and allocation-free per lock.
type heldCollector struct {
	page    *heldQuery // nil: the page's top rows of every group
	groups  map[heldGroupKey]*heldGroup
	order   []*heldGroup
	other   int // locks of groups beyond debugMaxGroups
	total   int
	partial bool // debugScanLimit reached: the counts are of the locks looked at
}

// full reports whether the collector has looked at debugScanLimit locks;
// the gathering then stops.
func (hc *heldCollector) full() bool {
	if hc.total >= debugScanLimit {
		hc.partial = true
		return true
	}
	return false
}

func newHeldCollector(page *heldQuery) *heldCollector {
	return &heldCollector{page: page, groups: map[heldGroupKey]*heldGroup{}}
}

// offer counts c and keeps it if it is among its group's rows.
func (hc *heldCollector) offer(c *heldCandidate) {
	hc.total++
	k := heldGroupKey{c.kind, c.namespace}
	g := hc.groups[k]
	if g == nil {
		if len(hc.order) >= debugMaxGroups && (hc.page == nil || k != hc.page.group) {
			hc.other++
			return
		}
		g = &heldGroup{key: k, byConn: map[uint64]int{}, top: heldTop{n: debugRowsPerGroup, better: moreImportant}}
		if hc.page != nil {
			g.top = heldTop{better: inKeyOrder}
			if k == hc.page.group {
				g.top.n = hc.page.limit + 1 // one more: is there a next page?
			}
		}
		hc.groups[k] = g
		hc.order = append(hc.order, g)
	}
	g.count++
	g.waiters += c.waiters
	g.byConn[c.connID]++
	if hc.page != nil && hc.page.hasAfter && comparePos(c.pos(), hc.page.after) <= 0 {
		return
	}
	g.top.offer(c)
}

// debugHeldGroup is one group of held locks on the page and in the JSON.
type debugHeldGroup struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Count     int    `json:"count"`          // locks held in the group
	Shown     int    `json:"shown"`          // of them listed in "held" (the top rows)
	Waiters   int    `json:"waiters"`        // waits in progress for them
	Pages     string `json:"pages,omitzero"` // the query string of the group's JSON pages (all its locks)
	Other     bool   `json:"other,omitzero"` // locks of namespaces beyond the page's group limit, counted only
	// Holders: how many of the group's locks each connection holds, the
	// most first (at most debugRowsPerGroup connections).
	Holders []debugGroupHolder `json:"holders,omitempty"`
}

// debugGroupHolder is a connection holding locks of a group.
type debugGroupHolder struct {
	Conn  uint64 `json:"conn"`
	Count int    `json:"count"`
}

// rows formats the rows kept, group by group (groups that others wait for
// first, then the largest), and describes the groups.
func (hc *heldCollector) rows(db int, now time.Time, sym siteNames) ([]debugHeld, []debugHeldGroup) {
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
	held := []debugHeld{}
	groups := []debugHeldGroup{}
	for _, g := range hc.order {
		kept := g.top.sorted()
		for i := range kept {
			held = append(held, kept[i].row(now, sym))
		}
		groups = append(groups, debugHeldGroup{Kind: g.key.kind, Namespace: g.key.namespace, Count: g.count, Shown: len(kept),
			Waiters: g.waiters, Pages: heldPagesQuery(db, g.key), Holders: g.holders()})
	}
	if hc.other > 0 {
		groups = append(groups, debugHeldGroup{Kind: "other", Count: hc.other, Other: true})
	}
	return held, groups
}

// holders lists the connections holding the group's locks, the most first.
func (g *heldGroup) holders() []debugGroupHolder {
	out := make([]debugGroupHolder, 0, len(g.byConn))
	for c, n := range g.byConn {
		out = append(out, debugGroupHolder{Conn: c, Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Conn < out[j].Conn
	})
	return out[:min(len(out), debugRowsPerGroup)]
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
func (c *keptHeld) row(now time.Time, sym siteNames) debugHeld {
	h := debugHeld{Kind: c.kind, Mode: c.mode, Scope: c.scope, Namespace: c.namespace, Conn: c.connID, PID: c.pid,
		State: c.state, Since: c.since, HeldSeconds: secondsSince(now, c.since), Site: c.site,
		Statement: truncate(c.stmt, 500), Count: c.count, Waiters: c.waiters}
	if h.Site == "" && c.stack.Recorded() {
		h.Site = sym.of(&c.stack)
	}
	switch {
	case c.cid != "":
		h.Key = describeID(c.cid)
		if c.advisory {
			h.AdvisoryKey = c.key.number() // Lock on Postgres
		}
	case c.advisory:
		h.Key = c.key.number()
		if !c.key.Pair {
			if o, ok := originOf(c.key.K1); ok {
				h.Name = o.label()
			}
		}
	default:
		h.Key = "writer"
	}
	return h
}

// advisoryCandidate fills the key fields of a Postgres advisory key: a key
// made by Lock is shown as Lock's namespace and id. It reads the name
// memory without allocating.
func advisoryCandidate(c *heldCandidate, k lockKey) {
	c.key, c.advisory, c.kind, c.namespace, c.cid = k, true, "advisory", "", ""
	if k.Pair {
		return
	}
	if name, ok := keyNames.lookup(k.K1); ok {
		if i := strings.IndexByte(name, 0); i >= 0 && validCanonicalID(name[i+1:]) {
			c.kind, c.namespace, c.cid = "lockset", name[:i], name[i+1:]
		}
	}
}

// siteNames symbolises call sites once per page load: the waiters of one
// hot lock were mostly asked for at the same place.
type siteNames map[callsite.Stack]string

func (s siteNames) of(c *callsite.Stack) string {
	if !c.Recorded() {
		return "unknown"
	}
	if name, ok := s[*c]; ok {
		return name
	}
	name := c.String()
	s[*c] = name
	return name
}

// eachHeld calls fn for each held key under the table's mutex, until fn
// returns false: fn must be quick and must not take other locks.
func (t *lockTable[K]) eachHeld(fn func(key K, e *sqlitelock.Hold[lockTaker]) bool) {
	t.core.EachHeld(fn)
}

// listBounded returns the first n waits in progress (the oldest), how many
// there are in all, and how many of them wait for each Postgres advisory
// key.
func (ww *waitWatch) listBounded(n int) ([]waitView, int, map[lockKey]int) {
	if ww == nil {
		return nil, 0, nil
	}
	var out []waitView
	total := 0
	var keys map[lockKey]int
	ww.mu.Lock()
	for w := ww.head; w != nil; w = w.next {
		total++
		if len(out) < n {
			out = append(out, viewLocked(w))
		}
		for _, k := range w.advKeys {
			if keys == nil {
				keys = map[lockKey]int{}
			}
			keys[k.exclusive()]++
		}
	}
	ww.mu.Unlock()
	for i := range out {
		out[i].symbolise()
	}
	return out, total, keys
}

// The JSON pages of held locks.

// parseHeldQuery reads ?db=&kind=&namespace=&after=&limit=; ok is false
// when the request asks for the summary instead.
func parseHeldQuery(q url.Values, ndb int) (*heldQuery, bool, error) {
	if !q.Has("kind") {
		return nil, false, nil
	}
	hq := &heldQuery{group: heldGroupKey{q.Get("kind"), q.Get("namespace")}, limit: 1000}
	if s := q.Get("db"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= ndb {
			return nil, true, errors.New("lockhooks: db must be the index of one of the databases given to DebugHandler")
		}
		hq.db = n
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, true, errors.New("lockhooks: limit must be a positive number")
		}
		hq.limit = min(n, debugPageLimit)
	}
	if s := q.Get("after"); s != "" {
		p, err := decodeHeldCursor(s)
		if err != nil {
			return nil, true, err
		}
		hq.after, hq.hasAfter = p, true
	}
	return hq, true, nil
}

// debugHeldPage is one JSON page of a group's held locks, in key order.
type debugHeldPage struct {
	Generated time.Time   `json:"generated"`
	Database  int         `json:"database"`
	Kind      string      `json:"kind"`
	Namespace string      `json:"namespace,omitempty"`
	Count     int         `json:"count"` // locks held in the group now
	Held      []debugHeld `json:"held"`
	Next      string      `json:"next,omitempty"` // the query string of the next page; absent on the last
}

// encodeHeldCursor and decodeHeldCursor turn a position into the opaque
// after= of the next page.
func encodeHeldCursor(p heldPos) string {
	var b bytes.Buffer
	b.WriteString(base64.RawURLEncoding.EncodeToString([]byte(p.cid)))
	for _, n := range []int64{p.k1, p.k2, int64(boolInt(p.shared)), int64(p.conn)} {
		b.WriteByte('.')
		b.WriteString(strconv.FormatInt(n, 10))
	}
	return b.String()
}

func decodeHeldCursor(s string) (heldPos, error) {
	bad := errors.New("lockhooks: after must be the cursor of a previous page's next")
	parts := strings.Split(s, ".")
	if len(parts) != 5 {
		return heldPos{}, bad
	}
	cid, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return heldPos{}, bad
	}
	var n [4]int64
	for i := range n {
		if n[i], err = strconv.ParseInt(parts[i+1], 10, 64); err != nil {
			return heldPos{}, bad
		}
	}
	return heldPos{cid: string(cid), k1: n[0], k2: n[1], shared: n[2] == 1, conn: uint64(n[3])}, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// heldPage formats the JSON page the collector gathered.
func (hc *heldCollector) heldPage(now time.Time, sym siteNames) debugHeldPage {
	q := hc.page
	p := debugHeldPage{Generated: now.UTC(), Database: q.db, Kind: q.group.kind, Namespace: q.group.namespace, Held: []debugHeld{}}
	g := hc.groups[q.group]
	if g == nil {
		return p
	}
	p.Count = g.count
	kept := g.top.sorted()
	if len(kept) > q.limit {
		kept = kept[:q.limit]
		v := url.Values{"format": {"json"}, "db": {strconv.Itoa(q.db)}, "kind": {q.group.kind},
			"after": {encodeHeldCursor(kept[len(kept)-1].pos())}, "limit": {strconv.Itoa(q.limit)}}
		if q.group.namespace != "" {
			v.Set("namespace", q.group.namespace)
		}
		p.Next = "?" + v.Encode()
	}
	for i := range kept {
		p.Held = append(p.Held, kept[i].row(now, sym))
	}
	return p
}

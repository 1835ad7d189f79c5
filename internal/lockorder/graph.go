package lockorder

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Lock is the checker's view of one lock a transaction or a connection
// took.
type Lock struct {
	// Class is the lock's class; "" for a lock of no known class, which
	// orders nothing.
	Class string
	// Column is the key column the ids of a row lock are of ("" if none).
	Column string
	// Lo and Hi are the smallest and the largest id taken, as ids compare
	// in lock order ("" if none).
	Lo, Hi string
	// Site is where the lock was taken; it is rendered only for a report
	// (nil renders as "unknown").
	Site fmt.Stringer
}

// Record is a pointer to the caller's record of a lock held, which
// carries the checker's view of that lock: the caller keeps its locks in
// its own records, and the graph reads them in place.
type Record[R any] interface {
	*R
	// Order returns the checker's view of the lock.
	Order() *Lock
}

// Graph is the order graph over lock classes, and the findings already
// reported (each is reported once). R is the caller's record of a lock
// held. It is safe for concurrent use.
type Graph[R any, P Record[R]] struct {
	describeID func(id string) string

	mu       sync.Mutex
	edges    map[string]map[string]*edge // from -> to
	reported map[string]bool             // cycles and warnings already reported
}

// edge is the first observation of one order.
type edge struct {
	fromSite, toSite fmt.Stringer
}

// New returns an empty graph; describeID renders an id of [Lock.Lo] and
// [Lock.Hi] for a report.
func New[R any, P Record[R]](describeID func(id string) string) *Graph[R, P] {
	return &Graph[R, P]{describeID: describeID, edges: make(map[string]map[string]*edge), reported: make(map[string]bool)}
}

// Taken records that l (whose Class is not "") is being taken while the
// locks of session (a connection's) and tx (its transaction's, in the
// order taken) are held, and returns what that reveals, if anything not
// reported before: an id below one of the same class taken earlier, or,
// for a class not held yet, the cycles its new orders close.
func (g *Graph[R, P]) Taken(l *Lock, session, tx []R) []Report {
	var reports []Report
	seen, warned := false, false
	for _, held := range [2][]R{session, tx} {
		for i := range held {
			h := P(&held[i]).Order()
			if h.Class != l.Class {
				continue
			}
			seen = true
			if !warned {
				if r, ok := g.descending(h, l); ok {
					reports, warned = append(reports, r), true
				}
			}
		}
	}
	if !seen {
		g.mu.Lock()
		for _, held := range [2][]R{session, tx} {
			for i := range held {
				h := P(&held[i]).Order()
				if h.Class == "" || h.Class == l.Class || heldBefore[R, P](held, i, h.Class) {
					continue
				}
				if r, ok := g.addEdgeLocked(h, l); ok {
					reports = append(reports, r)
				}
			}
		}
		g.mu.Unlock()
	}
	return reports
}

// heldBefore says whether a lock of class comes before held[i].
func heldBefore[R any, P Record[R]](held []R, i int, class string) bool {
	for j := range i {
		if P(&held[j]).Order().Class == class {
			return true
		}
	}
	return false
}

// Unordered reports, once per class and call site, that a row-locking
// query at site locked rows (more than one) of class without ORDER BY.
func (g *Graph[R, P]) Unordered(class string, site fmt.Stringer, rows int) (Report, bool) {
	s := render(site)
	key := "unordered\x00" + class + "\x00" + s
	g.mu.Lock()
	done := g.reported[key]
	g.reported[key] = true
	g.mu.Unlock()
	if done {
		return Report{}, false
	}
	return Report{Kind: UnorderedRows, Classes: []string{class}, Site: s, Detail: strconv.Itoa(rows) + " rows locked"}, true
}

// descending reports l's ids when they go below an id h took earlier in
// the same class (and key column).
func (g *Graph[R, P]) descending(h, l *Lock) (Report, bool) {
	if h.Hi == "" || l.Lo == "" || h.Column != l.Column || l.Lo >= h.Hi {
		return Report{}, false
	}
	site, earlier := render(l.Site), render(h.Site)
	key := "desc\x00" + l.Class + "\x00" + site + "\x00" + earlier
	g.mu.Lock()
	done := g.reported[key]
	g.reported[key] = true
	g.mu.Unlock()
	if done {
		return Report{}, false
	}
	what := "id"
	if l.Column != "" {
		what = l.Column
	}
	return Report{
		Kind: DescendingIDs, Classes: []string{l.Class}, Site: site, Earlier: earlier,
		Detail: fmt.Sprintf("%s %s after %s %s", what, g.describeID(l.Lo), what, g.describeID(h.Hi)),
	}, true
}

// addEdgeLocked adds the order from -> to and reports the cycle it closes,
// if any and not reported before; g.mu is held.
func (g *Graph[R, P]) addEdgeLocked(from, to *Lock) (Report, bool) {
	out := g.edges[from.Class]
	if out == nil {
		out = make(map[string]*edge)
		g.edges[from.Class] = out
	}
	if _, ok := out[to.Class]; ok {
		return Report{}, false
	}
	out[to.Class] = &edge{fromSite: from.Site, toSite: to.Site}
	path := g.pathLocked(to.Class, from.Class)
	if path == nil {
		return Report{}, false
	}
	// The cycle: from -> to -> … -> from; path runs from to.Class to from.Class.
	cycle := append([]string{from.Class}, path[:len(path)-1]...)
	key := canonicalCycle(cycle)
	if g.reported[key] {
		return Report{}, false
	}
	g.reported[key] = true
	r := Report{Kind: Cycle, Classes: cycle}
	for i, a := range cycle {
		b := cycle[(i+1)%len(cycle)]
		e := g.edges[a][b]
		r.Edges = append(r.Edges, Edge{From: a, To: b, FromSite: render(e.fromSite), ToSite: render(e.toSite)})
	}
	return r, true
}

// pathLocked returns the classes of a shortest path from -> … -> to in the
// graph, both ends included, or nil; g.mu is held.
func (g *Graph[R, P]) pathLocked(from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n == to {
			var path []string
			for ; n != ""; n = prev[n] {
				path = append(path, n)
				if n == from {
					break
				}
			}
			slices.Reverse(path)
			return path
		}
		next := make([]string, 0, len(g.edges[n]))
		for m := range g.edges[n] {
			next = append(next, m)
		}
		slices.Sort(next) // deterministic reports
		for _, m := range next {
			if _, ok := prev[m]; !ok {
				prev[m] = n
				queue = append(queue, m)
			}
		}
	}
	return nil
}

// canonicalCycle names a cycle independently of where it starts.
func canonicalCycle(cycle []string) string {
	start := 0
	for i, c := range cycle {
		if cmp.Less(c, cycle[start]) {
			start = i
		}
	}
	return "cycle\x00" + strings.Join(append(slices.Clone(cycle[start:]), cycle[:start]...), "\x00")
}

// render is a call site as a report names it.
func render(site fmt.Stringer) string {
	if site == nil {
		return "unknown"
	}
	return site.String()
}

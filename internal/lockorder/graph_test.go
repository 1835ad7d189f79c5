package lockorder

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// held is a caller's record of a lock held, as the root's records are.
type held struct{ lock Lock }

func (h *held) Order() *Lock { return &h.lock }

// site is a call site that renders as itself.
type site string

func (s site) String() string { return string(s) }

// describe renders a test id visibly, to show the graph uses it.
func describe(id string) string { return "#" + id }

func newGraph() *Graph[held, *held] { return New[held](describe) }

// step is one lock of a transaction: "A" (a class), "A:2" (id 2 of A),
// "A:1-5" (ids 1 to 5 in one call), "A.col:2" (id 2 of A's key column
// col), "" (a lock of no class), any of them followed by "@site" to name
// its call site. Ids compare as strings.
func step(spec string) Lock {
	spec, at, _ := strings.Cut(spec, "@")
	class, ids, _ := strings.Cut(spec, ":")
	class, column, _ := strings.Cut(class, ".")
	lo, hi, ok := strings.Cut(ids, "-")
	if !ok {
		hi = lo
	}
	l := Lock{Class: class, Column: column, Lo: lo, Hi: hi}
	if at != "" {
		l.Site = site(at)
	}
	return l
}

// run takes the locks of each transaction in turn, as a caller does: the
// lock being taken is not yet among those held, and a lock of no class is
// recorded but not checked. Sites not named are "t<transaction>.<step>".
func run(g *Graph[held, *held], txs ...[]string) []Report {
	var out []Report
	for t, specs := range txs {
		var tx []held
		for i, spec := range specs {
			l := step(spec)
			if l.Site == nil {
				l.Site = site(fmt.Sprintf("t%d.%d", t, i))
			}
			if l.Class != "" {
				out = append(out, g.Taken(&l, nil, tx)...)
			}
			tx = append(tx, held{l})
		}
	}
	return out
}

func TestCycles(t *testing.T) {
	cases := []struct {
		name string
		txs  [][]string
		want []Report
	}{{
		name: "one order, from several transactions and repeated classes",
		txs:  [][]string{{"A", "B"}, {"A", "B", "A", "C"}, {"B", "C"}, {"A", "B"}},
	}, {
		name: "an inversion, reported once, with the sites of both orders",
		txs:  [][]string{{"A", "B"}, {"B", "A"}, {"B", "A"}, {"A", "B"}},
		want: []Report{{Kind: Cycle, Classes: []string{"B", "A"}, Edges: []Edge{
			{From: "B", To: "A", FromSite: "t1.0", ToSite: "t1.1"},
			{From: "A", To: "B", FromSite: "t0.0", ToSite: "t0.1"},
		}}},
	}, {
		name: "three classes, none of whose pairs conflict",
		txs:  [][]string{{"A", "B"}, {"B", "C"}, {"C", "A"}, {"A", "B"}},
		want: []Report{{Kind: Cycle, Classes: []string{"C", "A", "B"}, Edges: []Edge{
			{From: "C", To: "A", FromSite: "t2.0", ToSite: "t2.1"},
			{From: "A", To: "B", FromSite: "t0.0", ToSite: "t0.1"},
			{From: "B", To: "C", FromSite: "t1.0", ToSite: "t1.1"},
		}}},
	}, {
		name: "the shortest cycle is the one named",
		txs:  [][]string{{"A", "B", "C"}, {"C", "A"}},
		want: []Report{{Kind: Cycle, Classes: []string{"C", "A"}, Edges: []Edge{
			{From: "C", To: "A", FromSite: "t1.0", ToSite: "t1.1"},
			{From: "A", To: "C", FromSite: "t0.0", ToSite: "t0.2"},
		}}},
	}, {
		name: "every new order that closes a cycle is its own report",
		txs:  [][]string{{"A", "B"}, {"A", "C"}, {"B", "C", "A"}},
		want: []Report{
			{Kind: Cycle, Classes: []string{"B", "A"}, Edges: []Edge{
				{From: "B", To: "A", FromSite: "t2.0", ToSite: "t2.2"},
				{From: "A", To: "B", FromSite: "t0.0", ToSite: "t0.1"},
			}},
			{Kind: Cycle, Classes: []string{"C", "A"}, Edges: []Edge{
				{From: "C", To: "A", FromSite: "t2.1", ToSite: "t2.2"},
				{From: "A", To: "C", FromSite: "t1.0", ToSite: "t1.1"},
			}},
		},
	}, {
		name: "a class held twice orders from its first hold only",
		txs:  [][]string{{"A", "B", "A", "C"}, {"C", "B"}},
		want: []Report{{Kind: Cycle, Classes: []string{"C", "B"}, Edges: []Edge{
			{From: "C", To: "B", FromSite: "t1.0", ToSite: "t1.1"},
			{From: "B", To: "C", FromSite: "t0.1", ToSite: "t0.3"},
		}}},
	}, {
		name: "locks of no class order nothing",
		txs:  [][]string{{"", "A"}, {"A", ""}, {"B", "", "A"}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := run(newGraph(), c.txs...)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("reports\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
}

func TestDescendingIDs(t *testing.T) {
	warn := func(class, detail, at, earlier string) Report {
		return Report{Kind: DescendingIDs, Classes: []string{class}, Site: at, Earlier: earlier, Detail: detail}
	}
	cases := []struct {
		name string
		txs  [][]string
		want []Report
	}{{
		name: "ascending by separate calls",
		txs:  [][]string{{"A:1", "A:2", "A:3-5", "A:6"}},
	}, {
		name: "descending by separate calls",
		txs:  [][]string{{"A:2", "A:1"}},
		want: []Report{warn("A", "id #1 after id #2", "t0.1", "t0.0")},
	}, {
		name: "below the highest id of an earlier call",
		txs:  [][]string{{"A:1-5", "A:3"}},
		want: []Report{warn("A", "id #3 after id #5", "t0.1", "t0.0")},
	}, {
		name: "once per pair of sites",
		txs:  [][]string{{"A:2@x", "A:1@y"}, {"A:2@x", "A:1@y"}, {"A:3@x", "A:2@y"}, {"A:3@z", "A:2@y"}},
		want: []Report{
			warn("A", "id #1 after id #2", "y", "x"),
			warn("A", "id #2 after id #3", "y", "z"),
		},
	}, {
		name: "once per lock taken, against its first higher id",
		txs:  [][]string{{"A:5", "A:6", "A:1"}},
		want: []Report{warn("A", "id #1 after id #5", "t0.2", "t0.0")},
	}, {
		name: "named by the key column",
		txs:  [][]string{{"table t.id:2", "table t.id:1"}},
		want: []Report{warn("table t", "id #1 after id #2", "t0.1", "t0.0")},
	}, {
		name: "other key columns, other classes, or no ids do not compare",
		txs:  [][]string{{"A.x:2", "A.y:1"}, {"A:2", "B:1"}, {"A", "A:1", "A"}},
	}, {
		name: "a descending id orders nothing new",
		txs:  [][]string{{"A:2", "A:1", "B"}, {"B", "C"}},
		want: []Report{warn("A", "id #1 after id #2", "t0.1", "t0.0")},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := run(newGraph(), c.txs...)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("reports\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
}

// TestSessionLocks: a connection's session locks order what its
// transactions take, and a session lock taken inside a transaction is
// ordered after the transaction's locks.
func TestSessionLocks(t *testing.T) {
	g := newGraph()
	s := step("S")
	s.Site = site("session")
	session := []held{{s}}
	a := step("A")
	a.Site = site("tx")
	if r := g.Taken(&a, session, nil); len(r) != 0 {
		t.Fatalf("S then A: %+v", r)
	}
	// Another transaction holds A when it takes S.
	a2, s2 := a, s
	a2.Site, s2.Site = site("tx2"), site("session2")
	r := g.Taken(&s2, nil, []held{{a2}})
	want := []Report{{Kind: Cycle, Classes: []string{"A", "S"}, Edges: []Edge{
		{From: "A", To: "S", FromSite: "tx2", ToSite: "session2"},
		{From: "S", To: "A", FromSite: "session", ToSite: "tx"},
	}}}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("reports\n%+v\nwant\n%+v", r, want)
	}
	// A class held by the session and taken again in the transaction
	// adds no order.
	if r := g.Taken(&s, session, []held{{a}}); len(r) != 0 {
		t.Errorf("S again: %+v", r)
	}
}

func TestUnordered(t *testing.T) {
	g := newGraph()
	cases := []struct {
		class string
		site  fmt.Stringer
		rows  int
		want  *Report
	}{
		{"table jobs", site("a.go:1"), 2, &Report{Kind: UnorderedRows, Classes: []string{"table jobs"}, Site: "a.go:1", Detail: "2 rows locked"}},
		{"table jobs", site("a.go:1"), 5, nil}, // the same site again
		{"table jobs", site("b.go:2"), 3, &Report{Kind: UnorderedRows, Classes: []string{"table jobs"}, Site: "b.go:2", Detail: "3 rows locked"}},
		{"table runs", site("a.go:1"), 4, &Report{Kind: UnorderedRows, Classes: []string{"table runs"}, Site: "a.go:1", Detail: "4 rows locked"}},
		{"table runs", nil, 2, &Report{Kind: UnorderedRows, Classes: []string{"table runs"}, Site: "unknown", Detail: "2 rows locked"}},
	}
	for i, c := range cases {
		r, ok := g.Unordered(c.class, c.site, c.rows)
		if ok != (c.want != nil) || ok && !reflect.DeepEqual(r, *c.want) {
			t.Errorf("%d: %+v, %v; want %+v", i, r, ok, c.want)
		}
	}
}

func TestCanonicalCycle(t *testing.T) {
	cases := []struct {
		a, b []string
		same bool
	}{
		{[]string{"A", "B"}, []string{"B", "A"}, true},
		{[]string{"A", "B", "C"}, []string{"C", "A", "B"}, true},
		{[]string{"B", "C", "A"}, []string{"A", "B", "C"}, true},
		{[]string{"A", "B", "C"}, []string{"A", "C", "B"}, false}, // the other direction
		{[]string{"A", "B"}, []string{"A", "B", "C"}, false},
		{[]string{"AB", "C"}, []string{"A", "BC"}, false},
	}
	for _, c := range cases {
		if same := canonicalCycle(c.a) == canonicalCycle(c.b); same != c.same {
			t.Errorf("%q and %q: same %v, want %v", c.a, c.b, same, c.same)
		}
	}
	in := []string{"C", "A", "B"}
	canonicalCycle(in)
	if !reflect.DeepEqual(in, []string{"C", "A", "B"}) {
		t.Errorf("canonicalCycle changed its argument: %q", in)
	}
}

// TestConcurrentInversion: goroutines take two classes in opposite
// orders at once; the cycle is reported exactly once in all.
func TestConcurrentInversion(t *testing.T) {
	g := newGraph()
	var (
		mu     sync.Mutex
		cycles []Report
		wg     sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			first, second := "A", "B"
			if w%2 == 1 {
				first, second = second, first
			}
			for range 200 {
				tx := []held{{Lock{Class: first, Site: site("first")}}}
				l := Lock{Class: second, Site: site("second")}
				r := g.Taken(&l, nil, tx)
				mu.Lock()
				cycles = append(cycles, r...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(cycles) != 1 || cycles[0].Kind != Cycle || len(cycles[0].Classes) != 2 {
		t.Fatalf("reports %+v, want one cycle of A and B", cycles)
	}
}

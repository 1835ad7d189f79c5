package debugpage

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// The view of a synthetic incident: 120 waiters of one holder, a chain,
// a cycle, 40 more single waiters of distinct holders, two databases.
// The summary puts the longest waits first and merges waits alike; the
// graph groups the 120 waiters in one node, keeps the cycle, and draws at
// most viewGraphNodes nodes; the busier database comes first.
func TestDebugViewSummaryAndGraph(t *testing.T) {
	now := time.Now()
	quiet := Database{Index: 0, Dialect: "postgres", Counters: map[string]int64{}}
	busy := Database{Index: 1, Dialect: "sqlite", Counters: map[string]int64{}}
	waiter := func(conn, holder uint64, key string, secs float64) Waiter {
		return Waiter{Kind: "lockset", Namespace: "invoices", Keys: key, Conn: conn, WaitSeconds: secs,
			Since: now.Add(-time.Duration(secs * float64(time.Second))), Site: "app/pay.go:12",
			Holders: []holders.Holder{{Conn: holder, Site: "app/batch.go:40", Since: now.Add(-time.Minute)}}}
	}
	for i := range 120 {
		busy.Waiters = append(busy.Waiters, waiter(uint64(100+i), 1, fmt.Sprint(i%7), float64(i)/10))
	}
	busy.Waiters = append(busy.Waiters, waiter(2, 3, "x", 50), waiter(3, 4, "y", 40)) // a chain 2 -> 3 -> 4
	cyc := waiter(5, 6, "a", 99)
	busy.Waiters = append(busy.Waiters, cyc, waiter(6, 5, "b", 98)) // a cycle 5 <-> 6
	for i := range 40 {
		busy.Waiters = append(busy.Waiters, waiter(uint64(1000+i), uint64(2000+i), "z", 1))
	}
	busy.WaitersTotal = len(busy.Waiters)
	busy.Graph = GraphOf(busy.Waiters, nil, "")
	v := buildView(Report{Generated: now, Databases: []Database{quiet, busy}}, 0, "n")

	if len(v.Databases) != 1 || v.Databases[0].Index != 1 || len(v.Quiet) != 1 || v.Summary.Lines[0].Index != 1 {
		t.Errorf("databases: busy %+v, quiet %d", v.Databases, len(v.Quiet))
	}
	s := v.Summary
	if s.Waits[0].Waiter.Conn != 5 || s.Waits[1].Waiter.Conn != 6 || s.Waiting != len(busy.Waiters) {
		t.Errorf("the longest waits are not first: %+v", s.Waits[:2])
	}
	var alike *summaryWait
	for i := range s.Waits {
		if s.Waits[i].Holder.Label == "conn #1" {
			alike = &s.Waits[i]
		}
	}
	if alike == nil || alike.Similar != 119 || alike.Waiter.WaitSeconds != 11.9 {
		t.Errorf("the 120 waits alike are not one line: %+v", alike)
	}
	if s.Holders[0].Holder.Label != "conn #1" || s.Holders[0].Blocks != 120 {
		t.Errorf("the holder blocking the most is not first: %+v", s.Holders[0])
	}

	g := v.Databases[0].Graph
	if len(g.Nodes) > viewGraphNodes || g.Hidden == 0 || !g.Cycle {
		t.Errorf("graph: %d nodes, %d hidden, cycle %v", len(g.Nodes), g.Hidden, g.Cycle)
	}
	var group *graphNode
	ids := map[string]bool{}
	for i, n := range g.Nodes {
		ids[n.ID] = true
		if n.Group == 120 {
			group = &g.Nodes[i]
		}
	}
	if group == nil || group.Label != "120 waiters" {
		t.Fatalf("no node for the 120 waiters of conn #1: %+v", g.Nodes)
	}
	for _, id := range []string{"conn-5", "conn-6", "conn-1"} {
		if !ids[id] {
			t.Errorf("%s is not drawn", id)
		}
	}
	for _, e := range g.Edges {
		if e.From == group.ID && (e.Label != "120× lockset invoices" || !strings.HasPrefix(e.Path, "M")) {
			t.Errorf("the group's edge: %+v", e)
		}
		if !ids[e.From] || !ids[e.To] {
			t.Errorf("an edge to a node not drawn: %+v", e)
		}
	}
	if g.W > 1400 || g.H > 2000 {
		t.Errorf("the graph is %dx%d", g.W, g.H)
	}
}

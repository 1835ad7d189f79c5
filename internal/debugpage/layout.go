package debugpage

// The page's wait graph: who waits for whom, collapsed so that many waiters
// of one holder are one node, laid out in columns by depth.

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// graphView is the wait-for graph as drawn: waiters on the left, what
// they wait for on the right, the waiters of one holder drawn as one node
// when there are many, at most viewGraphNodes nodes.
type graphView struct {
	Nodes   []graphNode
	Edges   []graphEdge
	Cycle   bool
	W, H    int
	Hidden  int // nodes not drawn (the tables list them)
	Grouped int // waiters drawn inside group nodes
}

// graphNode is a box of the drawn graph.
type graphNode struct {
	ID       string
	Label    string
	Detail   string
	Title    string
	External bool
	Group    int // > 0: this many waiters drawn as one node
	X, Y     float64
	col, row int
	weight   int
}

// graphEdge is an arrow of the drawn graph.
type graphEdge struct {
	From, To string
	Label    string
	Title    string
	InCycle  bool
	Path     string  // SVG path data
	LX, LY   float64 // where the label goes
	count    int
}

// Geometry of the drawn graph.
const (
	graphNodeW = 170.0
	graphNodeH = 40.0
	graphColW  = 320.0 // node and room for the edges' labels
	graphRowH  = 56.0
	graphPad   = 16.0
)

// collapseGraph makes the drawn graph of d.Graph.
func collapseGraph(d *Database) graphView {
	g := graphView{Cycle: d.Graph.Cycle}
	if len(d.Graph.Edges) == 0 {
		return g
	}
	waitSecs := map[string]float64{}
	for _, w := range d.Waiters {
		if w.Conn != 0 {
			id := "conn-" + strconv.FormatUint(w.Conn, 10)
			waitSecs[id] = math.Max(waitSecs[id], w.WaitSeconds)
		}
	}
	in := map[string]int{}
	out := map[string][]Edge{}
	for _, e := range d.Graph.Edges {
		in[e.To]++
		out[e.From] = append(out[e.From], e)
	}
	// Waiters that wait for one holder and that nobody waits for are
	// grouped per holder when there are many.
	single := map[string][]string{} // holder -> its single-target waiters
	for from, es := range out {
		if len(es) == 1 && in[from] == 0 && !es[0].InCycle {
			single[es[0].To] = append(single[es[0].To], from)
		}
	}
	grouped := map[string]string{} // waiter -> its group node
	nodes := map[string]*graphNode{}
	for _, n := range d.Graph.Nodes {
		nodes[n.ID] = &graphNode{ID: n.ID, Label: n.Label, Detail: n.Detail, External: n.External, Title: n.Label}
		if n.Detail != "" {
			nodes[n.ID].Title += " (" + n.Detail + ")"
		}
	}
	for holder, ws := range single {
		if len(ws) <= viewCollapseAbove {
			continue
		}
		id := "group-" + holder
		longest := 0.0
		for _, w := range ws {
			grouped[w] = id
			delete(nodes, w)
			longest = math.Max(longest, waitSecs[w])
		}
		sort.Strings(ws)
		nodes[id] = &graphNode{ID: id, Label: strconv.Itoa(len(ws)) + " waiters", Detail: "longest " + formatAge(longest), Group: len(ws),
			Title: fmt.Sprintf("%d connections wait for %s: %s", len(ws), nodes[holder].Label, holders.Truncate(strings.Join(ws, ", "), 300))}
		g.Grouped += len(ws)
	}
	// The edges, merged into their group nodes.
	type ek struct{ from, to string }
	edges := map[ek]*graphEdge{}
	var eorder []ek
	for _, e := range d.Graph.Edges {
		from := e.From
		if gid, ok := grouped[from]; ok {
			from = gid
		}
		k := ek{from, e.To}
		if x := edges[k]; x != nil {
			x.count++
			x.Label = commonLabel(x.Label, e.Label)
			continue
		}
		edges[k] = &graphEdge{From: from, To: e.To, Label: e.Label, InCycle: e.InCycle, count: 1}
		eorder = append(eorder, k)
	}
	// Weights: how many waiters each node stands for or holds up.
	for _, k := range eorder {
		e := edges[k]
		if n := nodes[e.To]; n != nil {
			n.weight += e.count
		}
	}
	// At most viewGraphNodes nodes: those on a cycle, then the heaviest.
	if len(nodes) > viewGraphNodes {
		ranked := make([]*graphNode, 0, len(nodes))
		for _, n := range nodes {
			ranked = append(ranked, n)
		}
		onCycle := map[string]bool{}
		for _, e := range edges {
			if e.InCycle {
				onCycle[e.From], onCycle[e.To] = true, true
			}
		}
		sort.Slice(ranked, func(i, j int) bool {
			a, b := ranked[i], ranked[j]
			if onCycle[a.ID] != onCycle[b.ID] {
				return onCycle[a.ID]
			}
			if a.weight+a.Group != b.weight+b.Group {
				return a.weight+a.Group > b.weight+b.Group
			}
			return a.ID < b.ID
		})
		for _, n := range ranked[viewGraphNodes:] {
			delete(nodes, n.ID)
			g.Hidden++
		}
	}
	for _, k := range eorder {
		e := edges[k]
		if nodes[e.From] == nil || nodes[e.To] == nil {
			continue
		}
		e.Title = e.Label
		if e.count > 1 {
			e.Label = strconv.Itoa(e.count) + "× " + e.Label
			e.Title = e.Label
		}
		e.Label = holders.Truncate(withoutKeyNumbers(e.Label), 24)
		g.Edges = append(g.Edges, *e)
	}
	layoutGraph(&g, nodes)
	return g
}

// commonLabel names what two waits have in common: "lockset invoices"
// for "lockset invoices / 1" and "lockset invoices / 2".
func commonLabel(a, b string) string {
	if len(a) > len(b) {
		a, b = b, a
	}
	if a == b || strings.HasPrefix(b, a) && b[len(a)] == ' ' {
		return a // a merged label already
	}
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	p := a[:n]
	if i := strings.LastIndex(p, " / "); i > 0 {
		p = p[:i]
	} else if i := strings.LastIndexByte(p, ' '); i > 0 {
		p = p[:i]
	} else {
		p = ""
	}
	if p == "" || p == a || p == b && !strings.Contains(b, " ") {
		return "various"
	}
	return p
}

// layoutGraph places the nodes in columns by their distance to what holds
// and waits for nothing (holders on the right, their waiters to the left),
// each column ordered by where its nodes' targets are, and routes the
// edges.
func layoutGraph(g *graphView, nodes map[string]*graphNode) {
	adj := map[string][]string{}
	for _, e := range g.Edges {
		adj[e.From] = append(adj[e.From], e.To)
	}
	ids := make([]string, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	// layer: the longest path to a sink, ignoring edges that close a cycle.
	layer := map[string]int{}
	state := map[string]int{} // 1: on the stack, 2: done
	var visit func(id string) int
	visit = func(id string) int {
		switch state[id] {
		case 1:
			return -1
		case 2:
			return layer[id]
		}
		state[id] = 1
		l := 0
		for _, t := range adj[id] {
			if lt := visit(t); lt >= 0 {
				l = max(l, lt+1)
			}
		}
		state[id], layer[id] = 2, l
		return l
	}
	top := 0
	for _, id := range ids {
		top = max(top, visit(id))
	}
	cols := make([][]*graphNode, top+1)
	for _, id := range ids {
		n := nodes[id]
		n.col = top - layer[id]
		cols[n.col] = append(cols[n.col], n)
	}
	// Order: the rightmost column by weight, each column to its left by
	// the mean row of its targets.
	for c := top; c >= 0; c-- {
		col := cols[c]
		key := map[string]float64{}
		for _, n := range col {
			if c == top {
				key[n.ID] = -float64(n.weight + n.Group)
				continue
			}
			sum, k := 0.0, 0
			for _, t := range adj[n.ID] {
				if m := nodes[t]; m != nil && m.col > c {
					sum += float64(m.row)
					k++
				}
			}
			key[n.ID] = math.Inf(1)
			if k > 0 {
				key[n.ID] = sum / float64(k)
			}
		}
		sort.SliceStable(col, func(i, j int) bool { return key[col[i].ID] < key[col[j].ID] })
		for r, n := range col {
			n.row = r
		}
	}
	rows := 0
	for _, col := range cols {
		rows = max(rows, len(col))
	}
	g.W = int(graphPad*2 + float64(top)*graphColW + graphNodeW)
	g.H = int(graphPad*2 + float64(rows-1)*graphRowH + graphNodeH + 40) // room for edges routed below
	for _, id := range ids {
		n := nodes[id]
		n.X = graphPad + float64(n.col)*graphColW + graphNodeW/2
		n.Y = graphPad + float64(n.row)*graphRowH + graphNodeH/2
		g.Nodes = append(g.Nodes, *n)
	}
	for i := range g.Edges {
		e := &g.Edges[i]
		a, b := nodes[e.From], nodes[e.To]
		if b.col > a.col { // forward: from the waiter's right side to the holder's left side
			x1, y1 := a.X+graphNodeW/2, a.Y
			x2, y2 := b.X-graphNodeW/2-2, b.Y
			mx := (x1 + x2) / 2
			e.Path = fmt.Sprintf("M%.0f,%.0f C%.0f,%.0f %.0f,%.0f %.0f,%.0f", x1, y1, mx, y1, mx, y2, x2, y2)
			e.LX, e.LY = x1+6, y1-6
			continue
		}
		// Back (a cycle) or within a column: below the boxes.
		x1, y1 := a.X, a.Y+graphNodeH/2
		x2, y2 := b.X+8, b.Y+graphNodeH/2+2
		dip := math.Max(y1, y2) + 34
		e.Path = fmt.Sprintf("M%.0f,%.0f C%.0f,%.0f %.0f,%.0f %.0f,%.0f", x1, y1, x1, dip, x2, dip, x2, y2)
		e.LX, e.LY = (x1+x2)/2, dip-6
	}
}

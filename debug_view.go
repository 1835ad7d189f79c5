package lockhooks

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// What the debug page shows, made from a debugReport: a summary for the
// whole process first (the longest waits with their holders, then the
// holders that block the most waiters, then one line per database), then
// the databases ordered by activity, each with its waits, a collapsed
// wait-for graph, its held locks grouped by kind and namespace, its last
// events and counters. Every list has a bound; what is left out is counted
// ("and 480 more") and one JSON page away.

// Bounds of the page (the JSON has more; see debug_bounds.go).
const (
	viewSummaryWaits   = 10 // longest waits in the summary
	viewSummaryHolders = 10 // holders in the summary
	viewWaiters        = 30 // waiters listed per database
	viewHeldRows       = 60 // held rows per database, shared by its groups
	viewGroups         = 12 // groups of held locks listed per database
	viewEvents         = 20 // events listed per database
	viewGraphNodes     = 30 // nodes drawn per graph
	viewCollapseAbove  = 3  // more waiters than this for one holder are drawn as one node
)

// debugView is the page's data.
type debugView struct {
	Generated time.Time
	RefreshMS int64
	Nonce     string
	Summary   summaryView
	Databases []dbView // with something held, waited for, happened or wrong, by activity
	Quiet     []dbView // the others, one line each
	Multi     bool     // more than one database: the summary names them
}

// summaryView is the top of the page.
type summaryView struct {
	Waiting, Held int // over every database
	Lines         []dbView
	Waits         []summaryWait
	MoreWaits     int
	Holders       []summaryHolder
	MoreHolders   int
}

// summaryWait is one of the longest waits, standing for the waits like
// it (same database, holder, kind, namespace and call site).
type summaryWait struct {
	DB      *dbView
	Waiter  debugWaiter
	What    string
	Holder  holderRef
	Others  int // further holders or blockers of the same wait
	Similar int // further waits like it
}

// holderRef is who holds what a waiter waits for.
type holderRef struct {
	Known    bool
	Label    string  // "conn #3 · pid 123", or "pid 4567" for another process
	App      string  // application_name (other processes)
	Site     string  // where it took the lock (this process)
	Held     float64 // seconds it has held the lock (this process) or been in its transaction (server), -1: unknown
	State    string  // the server's state of the backend
	Query    string  // its statement (server)
	External bool    // not a connection of this database
	key      string
}

// summaryHolder is one of the holders that block the most waiters.
type summaryHolder struct {
	DB      *dbView
	Holder  holderRef
	Blocks  int     // waiters it blocks
	Longest float64 // the longest of their waits, in seconds
	What    string  // what the longest waits for
}

// dbView is one database on the page.
type dbView struct {
	Index        int
	Anchor       string
	Label        string // "database 0 (sqlite)"
	Error        string
	Notes        []string
	WaitersTotal int
	Waiters      []debugWaiter
	MoreWaiters  int
	Longest      float64 // the longest wait, in seconds
	HeldTotal    int
	Groups       []groupView
	MoreGroups   int // groups not listed
	MoreGrouped  int // locks in them
	Graph        graphView
	EventsTotal  int
	Events       []debugEvent // newest first
	MoreEvents   int
	Counters     []counterRow
}

// groupView is one group of held locks with its top rows, the rows of
// one holder (same connection, call site, mode, scope and state) on one
// line: a transaction that locked 440 ids is one line, not 440.
type groupView struct {
	debugHeldGroup
	Lines []heldLine
	More  int // locks of the group not listed
}

// heldLine is one or more held locks of one holder.
type heldLine struct {
	First   debugHeld   // the first (most important) lock; its holder's facts
	Locks   []debugHeld // all the locks listed on the line
	Waiters int         // waits for them
}

// lineKey tells apart the holders of a group's rows.
type lineKey struct {
	conn                     uint64
	site, mode, scope, state string
}

// linesOf puts rows on lines, one per holder, in the rows' order.
func linesOf(rows []debugHeld) []heldLine {
	var lines []heldLine
	at := map[lineKey]int{}
	for _, r := range rows {
		k := lineKey{r.Conn, r.Site, r.Mode, r.Scope, r.State}
		i, ok := at[k]
		if !ok || r.Statement != "" {
			i = len(lines)
			at[k] = i
			lines = append(lines, heldLine{First: r})
		}
		lines[i].Locks = append(lines[i].Locks, r)
		lines[i].Waiters += r.Waiters
	}
	return lines
}

// counterRow is one counter, for a stable order on the page.
type counterRow struct {
	Name  string
	Value int64
}

// buildView makes the page's data from rep.
func buildView(rep debugReport, refresh time.Duration, nonce string) debugView {
	v := debugView{Generated: rep.Generated, RefreshMS: refresh.Milliseconds(), Nonce: nonce}
	all := make([]dbView, len(rep.Databases))
	for i := range rep.Databases {
		all[i] = buildDBView(&rep.Databases[i])
	}
	sort.SliceStable(all, func(i, j int) bool { return moreActive(&all[i], &all[j]) })
	for _, d := range all {
		if d.WaitersTotal > 0 || d.HeldTotal > 0 || d.EventsTotal > 0 || d.Error != "" || len(d.Notes) > 0 {
			v.Databases = append(v.Databases, d)
		} else {
			v.Quiet = append(v.Quiet, d)
		}
	}
	v.Multi = len(rep.Databases) > 1
	v.Summary = buildSummary(rep, v.Databases)
	v.Summary.Lines = append(append([]dbView{}, v.Databases...), v.Quiet...)
	return v
}

// moreActive orders databases: the most waiters first, then errors, then
// the most held locks, then events.
func moreActive(a, b *dbView) bool {
	switch {
	case a.WaitersTotal != b.WaitersTotal:
		return a.WaitersTotal > b.WaitersTotal
	case a.Longest != b.Longest:
		return a.Longest > b.Longest
	case (a.Error != "") != (b.Error != ""):
		return a.Error != ""
	case a.HeldTotal != b.HeldTotal:
		return a.HeldTotal > b.HeldTotal
	case a.EventsTotal != b.EventsTotal:
		return a.EventsTotal > b.EventsTotal
	}
	return a.Index < b.Index
}

// dbLabel names a database on the page.
func dbLabel(d *debugDatabase) string {
	s := "database " + strconv.Itoa(d.Index)
	if d.Dialect != "" {
		s += " (" + d.Dialect + ")"
	}
	return s
}

func buildDBView(d *debugDatabase) dbView {
	v := dbView{Index: d.Index, Anchor: "db-" + strconv.Itoa(d.Index), Label: dbLabel(d), Error: d.Error, Notes: d.Notes,
		WaitersTotal: max(d.WaitersTotal, len(d.Waiters)), HeldTotal: max(d.HeldTotal, len(d.Held))}

	// Waiters: the longest first.
	waiters := append([]debugWaiter{}, d.Waiters...)
	sort.SliceStable(waiters, func(i, j int) bool { return waiters[i].WaitSeconds > waiters[j].WaitSeconds })
	if len(waiters) > 0 {
		v.Longest = waiters[0].WaitSeconds
	}
	if len(waiters) > viewWaiters {
		waiters = waiters[:viewWaiters]
	}
	v.Waiters = waiters
	v.MoreWaiters = v.WaitersTotal - len(waiters)

	// Held locks by group, the rows shared out between the groups listed.
	groups := d.HeldGroups
	if len(groups) == 0 && len(d.Held) > 0 { // a report made without groups
		groups = []debugHeldGroup{{Kind: "held", Count: len(d.Held), Shown: len(d.Held)}}
	}
	listed := min(len(groups), viewGroups)
	perGroup := debugRowsPerGroup
	if listed > 0 {
		perGroup = min(debugRowsPerGroup, max(3, viewHeldRows/listed))
	}
	next := 0
	for i, g := range groups {
		shown := min(g.Shown, len(d.Held)-next)
		rows := d.Held[next : next+shown]
		next += shown
		if i >= listed {
			v.MoreGroups++
			v.MoreGrouped += g.Count
			continue
		}
		if len(rows) > perGroup {
			rows = rows[:perGroup]
		}
		v.Groups = append(v.Groups, groupView{debugHeldGroup: g, Lines: linesOf(rows), More: g.Count - len(rows)})
	}

	v.Graph = collapseGraph(d)

	// Events: the newest first.
	v.EventsTotal = len(d.Events)
	for i := len(d.Events) - 1; i >= 0 && len(v.Events) < viewEvents; i-- {
		v.Events = append(v.Events, d.Events[i])
	}
	v.MoreEvents = len(d.Events) - len(v.Events)
	for k, n := range d.Counters {
		v.Counters = append(v.Counters, counterRow{k, n})
	}
	sort.Slice(v.Counters, func(i, j int) bool { return v.Counters[i].Name < v.Counters[j].Name })
	return v
}

// buildSummary finds the longest waits and the holders that block the
// most waiters, over every database.
func buildSummary(rep debugReport, dbs []dbView) summaryView {
	var s summaryView
	byIndex := map[int]*dbView{}
	for i := range dbs {
		byIndex[dbs[i].Index] = &dbs[i]
	}
	type holderAcc struct {
		summaryHolder
		waiters map[uint64]bool
	}
	holders := map[string]*holderAcc{}
	var order []*holderAcc
	similar := map[string]int{} // a kind of wait -> its index in s.Waits
	for i := range rep.Databases {
		d := &rep.Databases[i]
		s.Waiting += max(d.WaitersTotal, len(d.Waiters))
		s.Held += max(d.HeldTotal, len(d.Held))
		dv := byIndex[d.Index]
		if dv == nil {
			continue
		}
		ours := heldByConn(d)
		waiters := append([]debugWaiter{}, d.Waiters...)
		sort.SliceStable(waiters, func(i, j int) bool { return waiters[i].WaitSeconds > waiters[j].WaitSeconds })
		for j, w := range waiters {
			refs := holdersOf(w, ours)
			sw := summaryWait{DB: dv, Waiter: w, What: waitWhat(w)}
			if len(refs) > 0 {
				sw.Holder, sw.Others = refs[0], len(refs)-1
			}
			kind := strings.Join([]string{strconv.Itoa(d.Index), sw.Holder.key, w.Kind, w.Namespace, w.Site}, "\x00")
			if k, ok := similar[kind]; ok {
				s.Waits[k].Similar++
			} else {
				similar[kind] = len(s.Waits)
				s.Waits = append(s.Waits, sw)
			}
			for _, r := range refs {
				key := strconv.Itoa(d.Index) + "/" + r.key
				h := holders[key]
				if h == nil {
					h = &holderAcc{summaryHolder: summaryHolder{DB: dv, Holder: r}, waiters: map[uint64]bool{}}
					holders[key] = h
					order = append(order, h)
				}
				id := w.Conn
				if id == 0 {
					id = uint64(1<<63) + uint64(j)
				}
				if !h.waiters[id] {
					h.waiters[id] = true
					h.Blocks++
				}
				if w.WaitSeconds >= h.Longest {
					h.Longest, h.What = w.WaitSeconds, sw.What
				}
			}
		}
	}
	sort.SliceStable(s.Waits, func(i, j int) bool { return s.Waits[i].Waiter.WaitSeconds > s.Waits[j].Waiter.WaitSeconds })
	if len(s.Waits) > viewSummaryWaits {
		s.Waits = s.Waits[:viewSummaryWaits]
	}
	s.MoreWaits = s.Waiting
	for _, w := range s.Waits {
		s.MoreWaits -= 1 + w.Similar
	}
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].Blocks != order[j].Blocks {
			return order[i].Blocks > order[j].Blocks
		}
		return order[i].Longest > order[j].Longest
	})
	for i, h := range order {
		if i == viewSummaryHolders {
			s.MoreHolders = len(order) - i
			break
		}
		s.Holders = append(s.Holders, h.summaryHolder)
	}
	return s
}

// heldByConn returns, for each connection of d with a held row, its
// oldest held lock: where it took it and since when.
func heldByConn(d *debugDatabase) map[uint64]debugHeld {
	out := map[uint64]debugHeld{}
	for _, h := range d.Held {
		if h.Conn == 0 {
			continue
		}
		if x, ok := out[h.Conn]; !ok || x.Since.IsZero() || (!h.Since.IsZero() && h.Since.Before(x.Since)) {
			out[h.Conn] = h
		}
	}
	return out
}

// holdersOf returns who holds what w waits for: its in-process holders,
// then the server's blockers that are not among them; a blocker that is
// a connection of this database is described by the locks it holds
// (ours).
func holdersOf(w debugWaiter, ours map[uint64]debugHeld) []holderRef {
	var out []holderRef
	for _, h := range w.Holders {
		r := holderRef{Known: true, Label: connLabel(h.Conn, h.PID), Site: h.Site, Held: -1, key: "conn-" + strconv.FormatUint(h.Conn, 10)}
		if !h.Since.IsZero() {
			r.Held = math.Max(0, w.WaitSeconds+w.Since.Sub(h.Since).Seconds())
		}
		out = append(out, r)
	}
	for _, b := range w.Blockers {
		r := holderRef{Known: true, App: b.ApplicationName, State: b.State, Query: b.Query, Held: b.XactSeconds}
		if b.Conn != 0 {
			r.Label, r.key = connLabel(b.Conn, b.PID), "conn-"+strconv.FormatUint(b.Conn, 10)
			if h, ok := ours[b.Conn]; ok && h.Site != "" {
				r.Site = h.Site
				if h.HeldSeconds > 0 {
					r.Held = h.HeldSeconds
				}
			}
		} else {
			r.Label, r.key, r.External = "pid "+strconv.Itoa(int(b.PID)), "pid-"+strconv.Itoa(int(b.PID)), true
		}
		out = append(out, r)
	}
	return out
}

// connLabel names a connection of this process.
func connLabel(conn uint64, pid int32) string {
	s := "conn #" + strconv.FormatUint(conn, 10)
	if pid != 0 {
		s += " · pid " + strconv.Itoa(int(pid))
	}
	return s
}

// waitWhat says what a waiter waits for, in a few words.
func waitWhat(w debugWaiter) string {
	switch w.Kind {
	case "sqlite_writer":
		return "the SQLite writer lock"
	case "server":
		return "a lock on the server: " + truncate(w.Statement, 80)
	case "row":
		return "a row: " + truncate(w.Statement, 80)
	}
	s := w.Kind
	if w.Namespace != "" {
		s += " " + truncate(w.Namespace, 40) + " /"
	}
	if w.Keys != "" {
		s += " " + truncate(withoutKeyNumbers(w.Keys), 60)
	}
	return s
}

// keyNumber is the advisory key describeKey writes after a name.
var keyNumber = regexp.MustCompile(` \(-?\d+\)`)

// withoutKeyNumbers leaves the names of named keys alone (the tables
// below the summary show the numbers too).
func withoutKeyNumbers(s string) string { return keyNumber.ReplaceAllString(s, "") }

// The collapsed wait-for graph.

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
func collapseGraph(d *debugDatabase) graphView {
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
	out := map[string][]debugEdge{}
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
			Title: fmt.Sprintf("%d connections wait for %s: %s", len(ws), nodes[holder].Label, truncate(strings.Join(ws, ", "), 300))}
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
		e.Label = truncate(withoutKeyNumbers(e.Label), 24)
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

// formatAge shows a duration in seconds the way the page does.
func formatAge(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// MarshalJSON leaves out the transaction age of a backend that is in no
// transaction (idle), instead of writing -1.
func (b pgBlocker) MarshalJSON() ([]byte, error) {
	type plain pgBlocker // without this method
	var x struct {
		plain
		XactSeconds *float64 `json:"xact_age_seconds,omitempty"`
	}
	x.plain = plain(b)
	if b.XactSeconds >= 0 {
		x.XactSeconds = &b.XactSeconds
	}
	return json.Marshal(x)
}

// UnmarshalJSON reads what MarshalJSON writes: an absent transaction age
// is -1.
func (b *pgBlocker) UnmarshalJSON(data []byte) error {
	type plain pgBlocker
	var x struct {
		plain
		XactSeconds *float64 `json:"xact_age_seconds"`
	}
	if err := json.Unmarshal(data, &x); err != nil {
		return err
	}
	*b = pgBlocker(x.plain)
	b.XactSeconds = -1
	if x.XactSeconds != nil {
		b.XactSeconds = *x.XactSeconds
	}
	return nil
}

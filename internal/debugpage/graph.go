package debugpage

// The wait-for graph of a database's waiters, as its JSON has it: who
// waits for whom, with in-process cycles marked. The page draws it
// collapsed (layout.go).

import (
	"math"
	"strconv"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// SecondsSince is how long ago t was at now, in seconds rounded to the
// millisecond, as the page shows ages and waits; 0 for a zero t.
func SecondsSince(now, t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return math.Round(now.Sub(t).Seconds()*1000) / 1000
}

// holderNodeID names the graph node of a holder that is not a connection
// of the database the graph is of.
func holderNodeID(h holders.Holder) string {
	id := "db-" + h.Database
	if h.Database == "" {
		id = "db#" + strconv.FormatUint(h.DatabaseNumber, 10)
	}
	if h.Process != "" {
		id = "proc-" + h.Process + "-" + id
	}
	return id + "-conn-" + strconv.FormatUint(h.Conn, 10)
}

// GraphOf builds the wait-for graph of the waiters of the database pool:
// an edge from each waiter to each holder or blocking backend; an edge
// between connections of this process that lies on a cycle is marked.
// pids are the backend pids of the database's open connections, by
// connection number. The page draws the graph collapsed (layout.go).
func GraphOf(waiters []Waiter, pids map[uint64]int32, pool string) Graph {
	g := Graph{Nodes: []Node{}, Edges: []Edge{}}
	index := map[string]int{}
	node := func(id, label, detail string, external bool) string {
		if _, ok := index[id]; !ok {
			index[id] = len(g.Nodes)
			g.Nodes = append(g.Nodes, Node{ID: id, Label: label, Detail: detail, External: external})
		}
		return id
	}
	connNode := func(id uint64) string {
		detail := ""
		if pid := pids[id]; pid != 0 {
			detail = "pid " + strconv.Itoa(int(pid))
		}
		return node("conn-"+strconv.FormatUint(id, 10), "conn #"+strconv.FormatUint(id, 10), detail, false)
	}
	seen := map[[2]string]bool{}
	edge := func(from, to, label string) {
		if from == to || seen[[2]string{from, to}] {
			return
		}
		seen[[2]string{from, to}] = true
		g.Edges = append(g.Edges, Edge{From: from, To: to, Label: label})
	}
	for _, w := range waiters {
		if w.Conn == 0 {
			continue
		}
		from := connNode(w.Conn)
		what := w.Kind
		switch {
		case w.Namespace != "":
			what += " " + w.Namespace + " / " + w.Keys
		case w.Keys != "":
			what += " " + w.Keys
		}
		for _, h := range w.Holders {
			switch {
			case h.Conn == 0, h.Depth > 1: // unknown, or it blocks a blocker, not this waiter
			case h.Process == "" && (h.Database == "" || h.Database == pool):
				edge(from, connNode(h.Conn), what)
			default: // a connection of another lockhooks database, of this process or another
				id, detail := holderNodeID(h), h.Database
				if detail == "" {
					detail = "database " + strconv.FormatUint(h.DatabaseNumber, 10)
				}
				if h.Process != "" {
					detail += ", process " + h.Process
				}
				if h.PID != 0 {
					detail += ", pid " + strconv.Itoa(int(h.PID))
				}
				edge(from, node(id, "conn #"+strconv.FormatUint(h.Conn, 10), detail, h.Process != ""), what)
			}
		}
		for _, b := range w.Blockers {
			if b.Depth > 1 {
				continue // blocks a blocker, not this waiter
			}
			detail := b.State
			if b.ApplicationName != "" {
				detail = b.ApplicationName
			}
			edge(from, node("pid-"+strconv.Itoa(int(b.PID)), "pid "+strconv.Itoa(int(b.PID)), detail, true), what)
		}
	}
	// An edge u→v lies on a cycle when u is reachable from v.
	adj := map[string][]string{}
	for _, e := range g.Edges {
		adj[e.From] = append(adj[e.From], e.To)
	}
	reaches := func(from, to string) bool {
		seen := map[string]bool{from: true}
		stack := []string{from}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if n == to {
				return true
			}
			for _, m := range adj[n] {
				if !seen[m] {
					seen[m] = true
					stack = append(stack, m)
				}
			}
		}
		return false
	}
	for i := range g.Edges {
		if reaches(g.Edges[i].To, g.Edges[i].From) {
			g.Edges[i].InCycle, g.Cycle = true, true
		}
	}
	return g
}

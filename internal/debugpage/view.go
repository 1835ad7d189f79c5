package debugpage

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// What the debug page shows, made from a Report: a summary for the
// whole process first (the longest waits with their holders, then the
// holders that block the most waiters, then one line per database), then
// the databases ordered by activity, each with its waits, a collapsed
// wait-for graph, its held locks grouped by kind and namespace, its last
// events and counters. Every list has a bound; what is left out is counted
// ("and 480 more") and one JSON page away.

// Bounds of the page (the JSON has more; see collect.go).
const (
	viewSummaryWaits   = 10 // longest waits in the summary
	viewSummaryHolders = 10 // holders in the summary
	viewWaiters        = 30 // waiters listed per database
	ViewHeldRows       = 60 // held rows per database, shared by its groups
	viewGroups         = 12 // groups of held locks listed per database
	ViewEvents         = 20 // events listed per database
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
	Waiter  Waiter
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
	Pool         string // its pool name
	Anchor       string
	Label        string // "database 0 (sqlite)"
	Error        string
	Notes        []string
	WaitersTotal int
	Waiters      []Waiter
	MoreWaiters  int
	Longest      float64 // the longest wait, in seconds
	HeldTotal    int
	Groups       []groupView
	MoreGroups   int // groups not listed
	MoreGrouped  int // locks in them
	Graph        graphView
	EventsTotal  int
	Events       []holders.Event // newest first
	MoreEvents   int
	Counters     []counterRow
}

// groupView is one group of held locks with its top rows, the rows of
// one holder (same connection, call site, mode, scope and state) on one
// line: a transaction that locked 440 ids is one line, not 440.
type groupView struct {
	Group
	Lines []heldLine
	More  int // locks of the group not listed
}

// heldLine is one or more held locks of one holder.
type heldLine struct {
	First   Held   // the first (most important) lock; its holder's facts
	Locks   []Held // all the locks listed on the line
	Waiters int    // waits for them
}

// lineKey tells apart the holders of a group's rows.
type lineKey struct {
	conn                     uint64
	site, mode, scope, state string
}

// linesOf puts rows on lines, one per holder, in the rows' order.
func linesOf(rows []Held) []heldLine {
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
func buildView(rep Report, refresh time.Duration, nonce string) debugView {
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
func dbLabel(d *Database) string {
	s := "database " + strconv.Itoa(d.Index)
	if d.Dialect != "" {
		s += " (" + d.Dialect + ")"
	}
	return s
}

func buildDBView(d *Database) dbView {
	v := dbView{Index: d.Index, Pool: d.Pool, Anchor: "db-" + strconv.Itoa(d.Index), Label: dbLabel(d), Error: d.Error, Notes: d.Notes,
		WaitersTotal: max(d.WaitersTotal, len(d.Waiters)), HeldTotal: max(d.HeldTotal, len(d.Held))}

	// Waiters: the longest first.
	waiters := append([]Waiter{}, d.Waiters...)
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
		groups = []Group{{Kind: "held", Count: len(d.Held), Shown: len(d.Held)}}
	}
	listed := min(len(groups), viewGroups)
	perGroup := RowsPerGroup
	if listed > 0 {
		perGroup = min(RowsPerGroup, max(3, ViewHeldRows/listed))
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
		v.Groups = append(v.Groups, groupView{Group: g, Lines: linesOf(rows), More: g.Count - len(rows)})
	}

	v.Graph = collapseGraph(d)

	// Events: the newest first.
	v.EventsTotal = len(d.Events)
	for i := len(d.Events) - 1; i >= 0 && len(v.Events) < ViewEvents; i-- {
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
func buildSummary(rep Report, dbs []dbView) summaryView {
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
		waiters := append([]Waiter{}, d.Waiters...)
		sort.SliceStable(waiters, func(i, j int) bool { return waiters[i].WaitSeconds > waiters[j].WaitSeconds })
		for j, w := range waiters {
			refs := holdersOf(w, d.Pool)
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

// holdersOf returns who holds what w, a waiter of the database pool,
// waits for: the holders at the root (connections of lockhooks databases,
// of this process or another) and the backends nobody identified, then
// those queued ahead of it.
func holdersOf(w Waiter, pool string) []holderRef {
	var roots, queued []holderRef
	for _, h := range w.Holders {
		r := holderRef{Known: true, Label: connLabel(h.Conn, h.PID), Site: h.Site, Held: -1, State: h.State, key: "conn-" + strconv.FormatUint(h.Conn, 10)}
		if h.Process != "" || h.Database != "" && h.Database != pool {
			r.Label, r.key, r.External = holderLabel(h), holderNodeID(h), h.Process != ""
		}
		if !h.Since.IsZero() {
			r.Held = math.Max(0, w.WaitSeconds+w.Since.Sub(h.Since).Seconds())
		}
		if h.Queued {
			r.Query = h.Statement
			queued = append(queued, r)
		} else {
			roots = append(roots, r)
		}
	}
	for _, b := range w.Blockers {
		r := holderRef{Known: true, App: b.ApplicationName, State: b.State, Query: b.Query, Held: b.XactSeconds,
			Label: "pid " + strconv.Itoa(int(b.PID)), key: "pid-" + strconv.Itoa(int(b.PID)), External: true}
		if b.Waiting {
			queued = append(queued, r)
		} else {
			roots = append(roots, r)
		}
	}
	return append(roots, queued...)
}

// holderLabel names a holder that is not a connection of the database
// shown: `conn #3 of "orders" · pid 812`, with its process when another.
func holderLabel(h holders.Holder) string {
	s := "conn #" + strconv.FormatUint(h.Conn, 10)
	switch {
	case h.Database != "":
		s += fmt.Sprintf(" of %q", h.Database)
	case h.DatabaseNumber != 0:
		s += " of database " + strconv.FormatUint(h.DatabaseNumber, 10)
	}
	if h.Process != "" {
		s += " · " + h.Process
	}
	if h.PID != 0 {
		s += " · pid " + strconv.Itoa(int(h.PID))
	}
	return s
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
func waitWhat(w Waiter) string {
	switch w.Kind {
	case "sqlite_writer":
		return "the SQLite writer lock"
	case "server":
		return "a lock on the server: " + holders.Truncate(w.Statement, 80)
	case "row":
		return "a row: " + holders.Truncate(w.Statement, 80)
	}
	s := w.Kind
	if w.Namespace != "" {
		s += " " + holders.Truncate(w.Namespace, 40) + " /"
	}
	if w.Keys != "" {
		s += " " + holders.Truncate(withoutKeyNumbers(w.Keys), 60)
	}
	return s
}

// keyNumber is the advisory key describeKey writes after a name.
var keyNumber = regexp.MustCompile(` \(-?\d+\)`)

// withoutKeyNumbers leaves the names of named keys alone (the tables
// below the summary show the numbers too).
func withoutKeyNumbers(s string) string { return keyNumber.ReplaceAllString(s, "") }

// The collapsed wait-for graph.

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

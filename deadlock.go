package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// Explaining a deadlock (SQLSTATE 40P01): Postgres's DETAIL names the
// backends of the cycle and the lock each waited for; lockhooks adds, per
// side, who it is (a connection of a lockhooks database of this process,
// with the call site where its transaction began, or a backend outside
// it), how long its transaction had run, its statement, what it held that
// the other side waited for, and advice that fits the pattern.

// A DeadlockSide is one backend of a deadlock cycle, as Postgres's DETAIL
// names it and lockhooks knows it.
type DeadlockSide struct {
	PID       int32         // its backend
	This      bool          // the transaction the error was returned to (the victim)
	Who       string        // its identity: database, connection, pid and where its transaction began (in this process), or application_name (outside)
	Site      string        // where its transaction began, when it is a connection of this process
	Ran       time.Duration // how long its transaction had run when the deadlock was reported, when known
	Statement string        // its last statement as pg_stat_activity showed it (the one that waited), never its arguments
	WaitedFor string        // the lock it waited for
	BlockedBy int32         // the backend that held it
	Held      []string      // what it held that another side waited for, then the locks lockhooks saw it take
}

// deadlockEdge is one line of the DETAIL: "Process pid waits for mode on
// target; blocked by process by."
type deadlockEdge struct {
	pid, by int32
	mode    string
	target  string
}

var deadlockLineRE = regexp.MustCompile(`Process (\d+) waits for (\w+) on (.+?); blocked by process (\d+)\.`)

// parseDeadlockDetail reads the wait-for edges of a deadlock's DETAIL.
func parseDeadlockDetail(detail string) []deadlockEdge {
	var out []deadlockEdge
	for _, m := range deadlockLineRE.FindAllStringSubmatch(detail, -1) {
		pid, _ := strconv.ParseInt(m[1], 10, 32)
		by, _ := strconv.ParseInt(m[4], 10, 32)
		out = append(out, deadlockEdge{pid: int32(pid), by: int32(by), mode: m[2], target: m[3]})
	}
	return out
}

var (
	relationRE = regexp.MustCompile(`^relation (\d+) of database \d+$`)
	tupleRE    = regexp.MustCompile(`^tuple \((\d+,\d+)\) of relation (\d+) of database \d+$`)
	advisoryRE = regexp.MustCompile(`^advisory lock \[\d+,(\d+),(\d+),([12])\]$`)
	txRE       = regexp.MustCompile(`^transaction (\d+)$`)
	relOIDRE   = regexp.MustCompile(`relation (\d+) of database`)
	whereRowRE = regexp.MustCompile(`while (\w+) tuple \((\d+,\d+)\) in relation "([^"]+)"`)
)

// deadlockFacts is what a side connection read about the cycle: each
// backend's pg_stat_activity row and the names of the relations.
type deadlockFacts struct {
	backends  map[int32]backendFacts
	relations map[string]string // oid → name
	err       error
}

type backendFacts struct {
	app       string
	state     string
	xactAge   float64 // seconds; < 0: no transaction
	statement string
}

// readDeadlockFacts reads, on the side connection (side_conn.go), the backends
// of the cycle and the relations the DETAIL names by oid.
func (c *connector) readDeadlockFacts(edges []deadlockEdge, detail string) deadlockFacts {
	f := deadlockFacts{backends: map[int32]backendFacts{}, relations: map[string]string{}}
	if len(edges) == 0 || c.opts.dialect != Postgres {
		return f
	}
	ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
	defer cancel()
	var pids []string
	for _, e := range edges {
		pids = append(pids, strconv.Itoa(int(e.pid)))
	}
	oids := []string{"0"}
	for _, m := range relOIDRE.FindAllStringSubmatch(detail, -1) {
		oids = append(oids, m[1])
	}
	f.err = c.side.use(ctx, func(side driver.Conn) error {
		clear(f.backends)
		clear(f.relations)
		rows, err := queryDirect(ctx, side, `SELECT 'b', a.pid::text, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1)::text, left(coalesce(a.query, ''), 500)
FROM pg_stat_activity a WHERE a.pid IN (`+strings.Join(pids, ",")+`)
UNION ALL
SELECT 'r', c.oid::text, c.oid::regclass::text, '', '', '' FROM pg_class c WHERE c.oid IN (`+strings.Join(oids, ",")+`)`, nil)
		if err != nil {
			return err
		}
		defer rows.Close()
		dest := make([]driver.Value, 6)
		for {
			if err := rows.Next(dest); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			switch pgdriver.AsString(dest[0]) {
			case "b":
				pid, _ := strconv.ParseInt(pgdriver.AsString(dest[1]), 10, 32)
				age, _ := strconv.ParseFloat(pgdriver.AsString(dest[4]), 64)
				f.backends[int32(pid)] = backendFacts{app: pgdriver.AsString(dest[2]), state: pgdriver.AsString(dest[3]), xactAge: age, statement: pgdriver.AsString(dest[5])}
			case "r":
				f.relations[pgdriver.AsString(dest[1])] = pgdriver.AsString(dest[2])
			}
		}
	})
	return f
}

// explainDeadlock fills the sides of de and its advice. where is the
// error's CONTEXT (which row the victim's statement waited for, and
// whether it was a foreign-key check).
func (c *conn) explainDeadlock(de *DeadlockError, where string) {
	edges := parseDeadlockDetail(de.Detail)
	if len(edges) == 0 {
		de.Advice = deadlockAdvice(de, where, nil)
		return
	}
	facts := c.connector.readDeadlockFacts(edges, de.Detail)
	self := c.pid.Load()
	held := map[int32][]string{}
	for _, e := range edges {
		held[e.by] = append(held[e.by], c.describeLockTarget(e, facts, true))
	}
	for _, e := range edges {
		s := DeadlockSide{PID: e.pid, BlockedBy: e.by, WaitedFor: c.describeLockTarget(e, facts, false), Held: held[e.pid], This: e.pid == self}
		b, known := facts.backends[e.pid]
		if known {
			s.Statement = b.statement
			if b.xactAge >= 0 {
				s.Ran = time.Duration(b.xactAge * float64(time.Second)).Round(time.Millisecond)
			}
		}
		var h holders.Holder
		seen := holders.Blocker{SeenBy: c.connector, PID: e.pid, ApplicationName: b.app, State: b.state, XactSeconds: b.xactAge, Query: b.statement}
		if !known {
			seen.XactSeconds = -1
		}
		other, identified := identify(seen, nil)
		switch {
		case s.This:
			h = c.asHolder(nil)
			if m := whereRowRE.FindStringSubmatch(where); m != nil && txRE.MatchString(e.target) {
				s.WaitedFor = fmt.Sprintf("row (%s) of %s (%s it), which backend %d's transaction locked or changed (%s on %s)", m[2], m[3], m[1], e.by, e.mode, e.target)
			}
			if len(de.Waiting) > 0 {
				s.WaitedFor = strings.Join(de.Waiting, ", ") + ": " + s.WaitedFor
			}
			s.Held = append(s.Held, de.Held...)
		case identified: // a connection of a lockhooks database, here or in another process
			h = other
			h.State, h.Statement = "", ""    // the side says what it ran
			de.others = append(de.others, h) // for the wait span's link
		}
		if h.Conn != 0 {
			if h.SiteKind == holders.SiteBegan {
				s.Site = h.Site
			}
			if !h.Since.IsZero() {
				s.Ran = time.Since(h.Since).Round(time.Millisecond)
			}
			h.Since = time.Time{} // Ran says it
			s.Who = h.String()
		} else {
			s.Who = fmt.Sprintf("backend pid %d outside this process", e.pid)
			if known && b.app != "" {
				s.Who += fmt.Sprintf(" (application_name %q)", b.app)
			}
		}
		de.Sides = append(de.Sides, s)
	}
	if facts.err != nil {
		de.Note = "reading pg_stat_activity for the other side failed: " + facts.err.Error()
	}
	de.Advice = deadlockAdvice(de, where, edges)
}

// describeLockTarget names the lock an edge waits for, as its waiter
// waits for it, or (held) as its holder holds it.
func (c *conn) describeLockTarget(e deadlockEdge, f deadlockFacts, held bool) string {
	t := e.target
	rel := func(oid string) string {
		if name := f.relations[oid]; name != "" {
			return name
		}
		return "relation " + oid
	}
	switch {
	case txRE.MatchString(t) && held:
		return fmt.Sprintf("rows its transaction locked or changed (%s)", t)
	case txRE.MatchString(t):
		return fmt.Sprintf("a row backend %d's transaction locked or changed (%s on %s)", e.by, e.mode, t)
	case tupleRE.MatchString(t):
		m := tupleRE.FindStringSubmatch(t)
		return fmt.Sprintf("row (%s) of %s (%s)", m[1], rel(m[2]), e.mode)
	case relationRE.MatchString(t):
		return fmt.Sprintf("table %s (%s)", rel(relationRE.FindStringSubmatch(t)[1]), e.mode)
	case advisoryRE.MatchString(t):
		m := advisoryRE.FindStringSubmatch(t)
		hi, _ := strconv.ParseInt(m[1], 10, 64)
		lo, _ := strconv.ParseInt(m[2], 10, 64)
		k := lockKey{K1: hi<<32 | lo}
		if m[3] == "2" {
			k = lockKey{Pair: true, K1: hi, K2: lo}
		}
		k.Shared = e.mode == "ShareLock"
		return "advisory key " + k.String() // with its name, where lockhooks knows one
	}
	return e.mode + " on " + t
}

// deadlockAdvice says what to change for the deadlock's pattern.
func deadlockAdvice(de *DeadlockError, where string, edges []deadlockEdge) string {
	const retry = "retry the transaction (lockhooks.RunInTx does)"
	keptForUpdate := false
	for _, h := range de.Held {
		keptForUpdate = keptForUpdate || strings.HasSuffix(h, "(FOR UPDATE)")
	}
	otherWrites := false
	for _, s := range de.Sides {
		if !s.This {
			w := strings.ToUpper(strings.TrimSpace(s.Statement))
			otherWrites = otherWrites || strings.HasPrefix(w, "INSERT") || strings.HasPrefix(w, "UPDATE")
		}
	}
	advisory, rows, tables := false, false, false
	for _, e := range edges {
		switch {
		case strings.HasPrefix(e.target, "advisory"):
			advisory = true
		case strings.HasPrefix(e.target, "relation"):
			tables = true
		default:
			rows = true
		}
	}
	switch {
	case strings.Contains(where, "FOR KEY SHARE OF"), keptForUpdate && otherWrites && rows:
		return "a foreign-key check (FOR KEY SHARE on the parent row, taken by INSERT or UPDATE of a child row) met a parent row locked FOR UPDATE: lock parent rows FOR NO KEY UPDATE, which foreign-key checks pass (lockhooks' rewrite, on by default: drop lockhooks.KeepForUpdate, the keep-for-update comment or WithKeyShareRewrite(false) for this statement), unless the row is deleted or its key changed; " + retry
	case advisory && !rows && !tables:
		return "two transactions took advisory keys in opposite orders: take them in one order everywhere (lockhooks.Lock sorts its ids; lockhooks.WithLockOrderCheck finds where the order differs); " + retry
	case rows && !tables:
		return "two transactions locked the same rows in opposite orders: lock rows in one order everywhere (ORDER BY the key in SELECT … FOR UPDATE, sort the ids before updating, or lockhooks.Lock them first); lockhooks.WithLockOrderCheck finds where the order differs; " + retry
	}
	return "take these locks in one order everywhere (lockhooks.WithLockOrderCheck finds where they are not); " + retry
}

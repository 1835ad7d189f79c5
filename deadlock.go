package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
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

var (
	relationRE = regexp.MustCompile(`^relation (\d+) of database \d+$`)
	tupleRE    = regexp.MustCompile(`^tuple \((\d+,\d+)\) of relation (\d+) of database \d+$`)
	advisoryRE = regexp.MustCompile(`^advisory lock \[\d+,(\d+),(\d+),([12])\]$`)
	txRE       = regexp.MustCompile(`^transaction (\d+)$`)
	whereRowRE = regexp.MustCompile(`while (\w+) tuple \((\d+,\d+)\) in relation "([^"]+)"`)
)

// readDeadlockFacts reads, on the side connection (side_conn.go), the
// backends of the cycle and the relations the DETAIL names by oid.
func (c *connector) readDeadlockFacts(edges []pgserver.DeadlockEdge, detail string) pgserver.DeadlockFacts {
	f := pgserver.DeadlockFacts{Backends: map[int32]pgserver.BackendFacts{}, Relations: map[string]string{}}
	if len(edges) == 0 || c.opts.dialect != Postgres {
		return f
	}
	ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
	defer cancel()
	query := pgserver.DeadlockFactsQuery(edges, detail)
	f.Err = c.side.Use(ctx, func(side driver.Conn) error {
		clear(f.Backends)
		clear(f.Relations)
		rows, err := rawconn.Query(ctx, side, query, nil)
		if err != nil {
			return err
		}
		return pgserver.ReadDeadlockFacts(rows, &f)
	})
	return f
}

// explainDeadlock fills the sides of de and its advice. where is the
// error's CONTEXT (which row the victim's statement waited for, and
// whether it was a foreign-key check).
func (c *conn) explainDeadlock(de *DeadlockError, where string) {
	edges := pgserver.ParseDeadlockDetail(de.Detail)
	if len(edges) == 0 {
		de.Advice = deadlockAdvice(de, where, nil)
		return
	}
	facts := c.connector.readDeadlockFacts(edges, de.Detail)
	self := c.pid.Load()
	held := map[int32][]string{}
	for _, e := range edges {
		held[e.By] = append(held[e.By], c.describeLockTarget(e, facts, true))
	}
	for _, e := range edges {
		s := DeadlockSide{PID: e.PID, BlockedBy: e.By, WaitedFor: c.describeLockTarget(e, facts, false), Held: held[e.PID], This: e.PID == self}
		b, known := facts.Backends[e.PID]
		if known {
			s.Statement = b.Statement
			if b.XactAge >= 0 {
				s.Ran = time.Duration(b.XactAge * float64(time.Second)).Round(time.Millisecond)
			}
		}
		var h holders.Holder
		seen := holders.Blocker{SeenBy: c.connector, PID: e.PID, ApplicationName: b.App, State: b.State, XactSeconds: b.XactAge, Query: b.Statement}
		if !known {
			seen.XactSeconds = -1
		}
		other, identified := identify(seen, nil)
		switch {
		case s.This:
			h = c.asHolder(nil)
			if m := whereRowRE.FindStringSubmatch(where); m != nil && txRE.MatchString(e.Target) {
				s.WaitedFor = fmt.Sprintf("row (%s) of %s (%s it), which backend %d's transaction locked or changed (%s on %s)", m[2], m[3], m[1], e.By, e.Mode, e.Target)
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
			s.Who = fmt.Sprintf("backend pid %d outside this process", e.PID)
			if known && b.App != "" {
				s.Who += fmt.Sprintf(" (application_name %q)", b.App)
			}
		}
		de.Sides = append(de.Sides, s)
	}
	if facts.Err != nil {
		de.Note = "reading pg_stat_activity for the other side failed: " + facts.Err.Error()
	}
	de.Advice = deadlockAdvice(de, where, edges)
}

// describeLockTarget names the lock an edge waits for, as its waiter
// waits for it, or (held) as its holder holds it.
func (c *conn) describeLockTarget(e pgserver.DeadlockEdge, f pgserver.DeadlockFacts, held bool) string {
	t := e.Target
	rel := func(oid string) string {
		if name := f.Relations[oid]; name != "" {
			return name
		}
		return "relation " + oid
	}
	switch {
	case txRE.MatchString(t) && held:
		return fmt.Sprintf("rows its transaction locked or changed (%s)", t)
	case txRE.MatchString(t):
		return fmt.Sprintf("a row backend %d's transaction locked or changed (%s on %s)", e.By, e.Mode, t)
	case tupleRE.MatchString(t):
		m := tupleRE.FindStringSubmatch(t)
		return fmt.Sprintf("row (%s) of %s (%s)", m[1], rel(m[2]), e.Mode)
	case relationRE.MatchString(t):
		return fmt.Sprintf("table %s (%s)", rel(relationRE.FindStringSubmatch(t)[1]), e.Mode)
	case advisoryRE.MatchString(t):
		m := advisoryRE.FindStringSubmatch(t)
		hi, _ := strconv.ParseInt(m[1], 10, 64)
		lo, _ := strconv.ParseInt(m[2], 10, 64)
		k := lockKey{K1: hi<<32 | lo}
		if m[3] == "2" {
			k = lockKey{Pair: true, K1: hi, K2: lo}
		}
		k.Shared = e.Mode == "ShareLock"
		return "advisory key " + k.String() // with its name, where lockhooks knows one
	}
	return e.Mode + " on " + t
}

// deadlockAdvice says what to change for the deadlock's pattern.
func deadlockAdvice(de *DeadlockError, where string, edges []pgserver.DeadlockEdge) string {
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
		case strings.HasPrefix(e.Target, "advisory"):
			advisory = true
		case strings.HasPrefix(e.Target, "relation"):
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

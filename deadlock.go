package lockhooks

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/pgserver"
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

// readDeadlockFacts reads what the server still shows of a deadlock's
// backends and relations (pgblocking.Reader.DeadlockFacts), on Postgres.
func (c *connector) readDeadlockFacts(edges []pgserver.DeadlockEdge, detail string) pgserver.DeadlockFacts {
	if c.opts.dialect != Postgres {
		edges = nil // (none read)
	}
	return c.Blocking.DeadlockFacts(edges, detail)
}

// explainDeadlock fills the sides of de and its advice. where is the
// error's CONTEXT (which row the victim's statement waited for, and
// whether it was a foreign-key check).
func (c *conn) explainDeadlock(de *DeadlockError, where string) {
	edges := pgserver.ParseDeadlockDetail(de.Detail)
	if len(edges) == 0 {
		de.Advice = pgserver.DeadlockAdvice(de.Held, nil, where, nil)
		return
	}
	facts := c.connector.readDeadlockFacts(edges, de.Detail)
	self := c.pin.PID.Load()
	held := map[int32][]string{}
	for _, e := range edges {
		held[e.By] = append(held[e.By], pgserver.DescribeTarget(e, facts, true, describeAdvisoryKey))
	}
	for _, e := range edges {
		s := DeadlockSide{PID: e.PID, BlockedBy: e.By, WaitedFor: pgserver.DescribeTarget(e, facts, false, describeAdvisoryKey), Held: held[e.PID], This: e.PID == self}
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
			h = holding.Of(c, []lockKey(nil))
			if row, ok := pgserver.DescribeRowWait(e, where); ok {
				s.WaitedFor = row
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
	var others []string
	for _, side := range de.Sides {
		if !side.This {
			others = append(others, side.Statement)
		}
	}
	de.Advice = pgserver.DeadlockAdvice(de.Held, others, where, edges)
}

// deadlockOthers returns the other sides of the deadlock err reports
// that are connections of this process, if err reports one
// (pgstmt.Database.Others).
func deadlockOthers(err error) []holders.Holder {
	var de *DeadlockError
	if errors.As(err, &de) {
		return de.others
	}
	return nil
}

// describeAdvisoryKey formats a key of a deadlock's DETAIL as lockhooks
// shows keys (with its name, where lockhooks knows one).
func describeAdvisoryKey(k advisorykey.Key) string { return lockKey(k).String() }

package pgserver

import (
	"database/sql/driver"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// MaxBlockerDepth bounds how far a chain of waits is followed.
const MaxBlockerDepth = 8

// MaxQueuedListed bounds the backends queued ahead (waiting themselves)
// listed for one wait: in a queue of n waiters on one lock, the last one
// has n-1 ahead of it, and listing them all would make the read, the page
// and every log line grow with the square of the queue. The holders at
// the root are always listed; [Backend.Queued] counts the rest.
const MaxQueuedListed = 10

// Backend is one backend of a read of who blocks whom: what
// pg_stat_activity shows of it and whom it waits for.
type Backend struct {
	Asked    bool            // one of the backends the read was asked about
	Shown    bool            // pg_stat_activity shows it (a prepared transaction has no backend)
	Row      holders.Blocker // as the model names it (Depth and Waiting unset)
	Query    string          // its statement, for a waiter
	Wait     string          // wait_event_type/wait_event
	QueryAge float64         // seconds its statement has run; -1: unknown
	Blockers []int32         // pg_blocking_pids: the backends that do not wait themselves, then the first MaxQueuedListed that do, in the server's order
	Queued   int             // how many of its blockers wait themselves
}

// Waits reports whether b waits for another backend.
func (b *Backend) Waits() bool { return len(b.Blockers) > 0 }

// BlockersQuery is the read of who blocks the backends the query waiters
// returns (one column of pids), and whom those wait for, to the root. It
// costs time linear in the backends: each backend's pg_blocking_pids is
// evaluated once (a recursive UNION over distinct pids, not over paths: a
// queue of n waiters on one lock has n! paths), and only the blockers each
// backend names are sent, at most MaxQueuedListed of them waiting; Chain
// follows the chains.
func BlockersQuery(waiters string) string {
	return `WITH RECURSIVE w(pid) AS (
	` + waiters + `
), reach(pid) AS (
	SELECT pid FROM w
	UNION
	SELECT unnest(pg_blocking_pids(r.pid)) FROM reach r
), e AS (
	SELECT pid, pg_blocking_pids(pid) AS bs FROM reach
), edge AS (
	SELECT e.pid, b.pid AS blocker, b.n, b.pid IN (SELECT pid FROM e WHERE cardinality(bs) > 0) AS waiting
	FROM e CROSS JOIN LATERAL unnest(e.bs) WITH ORDINALITY AS b(pid, n)
), ranked AS (
	SELECT pid, blocker, waiting, row_number() OVER (PARTITION BY pid, waiting ORDER BY n) AS nth FROM edge
), kept AS (
	SELECT pid, string_agg(blocker::text, ',' ORDER BY waiting, nth) FILTER (WHERE NOT waiting OR nth <= ` + strconv.Itoa(MaxQueuedListed) + `) AS blockers,
		count(*) FILTER (WHERE waiting) AS queued
	FROM ranked GROUP BY pid
)
SELECT r.pid::bigint, r.pid IN (SELECT pid FROM w), a.pid IS NOT NULL, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(a.wait_event_type || '/' || a.wait_event, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1),
	coalesce(extract(epoch FROM clock_timestamp() - a.state_change)::float8, -1),
	coalesce(extract(epoch FROM clock_timestamp() - a.query_start)::float8, -1),
	left(coalesce(a.query, ''), 1000), coalesce(k.blockers, ''), coalesce(k.queued, 0)
FROM reach r LEFT JOIN kept k ON k.pid = r.pid LEFT JOIN pg_stat_activity a ON a.pid = r.pid
ORDER BY 1`
}

// ReadBackends reads the rows of BlockersQuery and closes them: the
// backends found, by pid, and their pids in order; seenBy is the database
// whose side connection read them (holders.Blocker.SeenBy).
func ReadBackends(rows driver.Rows, seenBy any) (map[int32]*Backend, []int32, error) {
	defer rows.Close()
	backends := map[int32]*Backend{}
	var order []int32 // by pid
	dest := make([]driver.Value, 12)
	for {
		err := rows.Next(dest)
		if err == io.EOF {
			return backends, order, nil
		}
		if err != nil {
			return nil, nil, err
		}
		b := &Backend{Asked: pgdriver.AsBool(dest[1]), Shown: pgdriver.AsBool(dest[2]), Wait: pgdriver.AsString(dest[5]),
			QueryAge: pgdriver.AsFloat64(dest[8]), Query: pgdriver.AsString(dest[9]), Queued: int(pgdriver.AsInt64(dest[11]))}
		b.Row = holders.Blocker{SeenBy: seenBy, PID: int32(pgdriver.AsInt64(dest[0])), ApplicationName: pgdriver.AsString(dest[3]),
			State: pgdriver.AsString(dest[4]), XactSeconds: pgdriver.AsFloat64(dest[6]), StateSeconds: pgdriver.AsFloat64(dest[7]), Query: b.Query}
		if b.Row.XactSeconds >= 0 {
			b.Row.XactSeconds = holders.Round3(b.Row.XactSeconds)
		}
		for _, f := range strings.Split(pgdriver.AsString(dest[10]), ",") {
			if p, err := strconv.ParseInt(f, 10, 32); err == nil {
				b.Blockers = append(b.Blockers, int32(p))
			}
		}
		backends[b.Row.PID] = b
		order = append(order, b.Row.PID)
	}
}

// Chain follows the waits of backend pid, breadth first to
// MaxBlockerDepth: the backends that block it (depth 1), those that block
// them, and so on, each once at the depth first met, sorted by depth and
// pid (at one depth, those that do not wait first); the holders at the
// root all, and at most MaxQueuedListed of those that wait themselves.
func Chain(pid int32, backends map[int32]*Backend) []holders.Blocker {
	seen := map[int32]bool{pid: true}
	var out []holders.Blocker
	queued := 0
	level := []int32{pid}
	for depth := 1; depth <= MaxBlockerDepth && len(level) > 0; depth++ {
		var next []int32
		for _, p := range level {
			for _, bp := range backends[p].Blockers {
				b := backends[bp]
				if seen[bp] || b == nil {
					continue // met already, or it appeared after the chains were read
				}
				seen[bp] = true
				next = append(next, bp)
				if !b.Shown {
					continue // no backend to show (a prepared transaction); its own blockers still count
				}
				s := b.Row
				s.Depth, s.Waiting = depth, b.Waits()
				if s.Waiting {
					if queued >= MaxQueuedListed {
						continue
					}
					queued++
					if s.State == "active" && b.QueryAge >= 0 {
						s.WaitSeconds = holders.Round3(b.QueryAge)
					}
				}
				out = append(out, s)
			}
		}
		level = next
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Depth != out[j].Depth {
			return out[i].Depth < out[j].Depth
		}
		if out[i].Waiting != out[j].Waiting {
			return !out[i].Waiting
		}
		return out[i].PID < out[j].PID
	})
	return out
}

package pgsession

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// EndQueue is the backends of lost holders still to be ended on the
// server, by the monitor, on its side connection. Its mutex is a leaf: it
// is taken with any other held, and nothing is taken under it.
type EndQueue struct {
	mu      sync.Mutex
	pending map[int32]*EndRequest // by backend pid
	kick    chan struct{}         // wakes the monitor (buffered, one)
}

// Kick is the channel the queue wakes its monitor by: it receives once
// after one or more requests were added, and the monitor's own waits may
// send on it too (a buffer of one: a send that would block is dropped).
func (q *EndQueue) Kick() chan struct{} { return q.kick }

// EndRequest asks for a backend to be ended if it holds or awaits one of
// keys (any advisory lock, with any), and is still the backend lockhooks
// gave up on (target).
type EndRequest struct {
	Target EndTarget
	Keys   []advisorykey.Key
	Any    bool
	Since  time.Time
}

// EndTarget names the backend an end request is for: one incarnation of a
// pid, which must have run nothing since lockhooks last talked to it.
type EndTarget struct {
	PID int32
	// Incarnation is the backend's, as IncarnationExpr read it when the
	// connection opened ("": not known).
	Incarnation string
	// Quiet is the time (this process's monotonic clock) after which the
	// backend started no statement of lockhooks' connection (see
	// RoundTrips.Target): a statement started after it is not lockhooks'.
	Quiet time.Time
	// InFlight says that a statement was sent after Quiet and never
	// answered: it may have started on the server up to SentQuiet (its
	// sending plus EndSlack), so a backend that started a statement after
	// Quiet is ended only while it still runs that very text (Sent; ""
	// never matches).
	InFlight  bool
	SentQuiet time.Time
	Sent      string
}

// IncarnationExpr reads, on a connection's backend, what names that
// backend among all that had its pid: its backend_start and its server's
// start time, in microseconds since the epoch (numbers, so that no session
// setting changes their text). A pid alone does not: the server reuses
// pids, and a failover (a multi-host DSN, a moved address) reaches another
// server, whose pids collide with the first's.
const IncarnationExpr = "(SELECT (extract(epoch FROM backend_start) * 1000000)::bigint::text FROM pg_stat_get_activity(pg_backend_pid())) || '@' || " + serverStartExpr

// serverStartExpr is the server's start time in IncarnationExpr.
const serverStartExpr = "(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text"

// EndSlack is how long after lockhooks sent a statement that was never
// answered (its connection broke) the server may still have started it:
// the time it may take to get there. A statement another client started
// on the backend within it is told from lockhooks' own by its text (see
// EndTarget.InFlight).
const EndSlack = 500 * time.Millisecond

// ReadIncarnation returns the value IncarnationExpr read, or "" if it is
// not one (NULL, or not two integers), so that it is safe as a literal.
func ReadIncarnation(s string) string {
	start, server, ok := strings.Cut(s, "@")
	if !ok || !integer(start) || !integer(server) {
		return ""
	}
	return s
}

// integer reports whether s is a decimal integer.
func integer(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// A QueryRow runs one of lockhooks' own statements on a side connection
// (one database/sql does not hold) and returns its first row, nil if it
// has none.
type QueryRow func(ctx context.Context, query string, args []driver.NamedValue) ([]driver.Value, error)

// EndPatience is how long a request waits for its backend to show one of
// its keys in pg_locks: the backend of a connection that broke while its
// lock statement was on the way may reach the lock after the monitor first
// looks. A backend that is gone, or ended, ends the request at once.
const EndPatience = 10 * time.Second

// NewEndQueue returns an empty queue.
func NewEndQueue() *EndQueue {
	return &EndQueue{pending: map[int32]*EndRequest{}, kick: make(chan struct{}, 1)}
}

// add asks for backend t to be ended if it holds or awaits one of keys, or,
// with any, any advisory lock. A request for another incarnation of the
// same pid replaces the older one (that backend is gone).
func (q *EndQueue) Add(t EndTarget, keys []advisorykey.Key, any bool) {
	if t.Incarnation == "" {
		return // the backend cannot be told from others with its pid
	}
	q.mu.Lock()
	r := q.pending[t.PID]
	if r == nil || r.Target.Incarnation != t.Incarnation {
		r = &EndRequest{Target: t, Since: time.Now()}
		q.pending[t.PID] = r
	}
	if t.Quiet.After(r.Target.Quiet) || t.InFlight && t.SentQuiet.After(r.Target.SentQuiet) {
		if t.Quiet.After(r.Target.Quiet) {
			r.Target.Quiet = t.Quiet
		}
		r.Target.InFlight, r.Target.SentQuiet, r.Target.Sent = t.InFlight, t.SentQuiet, t.Sent
	}
	r.Keys = append(r.Keys, keys...)
	r.Any = r.Any || any
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}: // wake the monitor
	default:
	}
}

// empty reports whether nothing waits to be ended.
func (q *EndQueue) Empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) == 0
}

// take removes and returns what waits to be ended.
func (q *EndQueue) Take() map[int32]*EndRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.pending
	q.pending = map[int32]*EndRequest{}
	return out
}

// putBack returns requests not yet carried out, for the monitor's next
// round.
func (q *EndQueue) PutBack(reqs map[int32]*EndRequest) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for pid, r := range reqs {
		if cur := q.pending[pid]; cur != nil {
			if cur.Target.Incarnation == r.Target.Incarnation {
				cur.Keys = append(cur.Keys, r.Keys...)
				cur.Any = cur.Any || r.Any
			}
			continue // (or a newer incarnation's request replaced it)
		}
		q.pending[pid] = r
	}
}

// EndBackend ends r's backend if it holds or awaits one of r's keys, and
// says whether it was still there (the same incarnation, on the same
// server, having run nothing since r.Target.Quiet) and whether it was
// ended. Whether it ran something since is told by query_start (NULL where
// the server does not track activity: then nothing is ended), not
// state_change: a lock a backend of ours awaited when its connection
// broke, granted later, changes its state but not its query_start.
// Another client a session pooler gave the backend to, after the pooler's
// reset (DISCARD ALL) freed the lock, starts statements after it; within
// EndSlack of a statement that was never answered, only the text tells
// (r.Target.InFlight): the backend must still be running the very text
// that was sent.
func EndBackend(ctx context.Context, side QueryRow, r *EndRequest) (alive, ended bool, err error) {
	match := ""
	if !r.Any {
		ids := make([]string, len(r.Keys))
		for i, k := range r.Keys {
			class, obj, sub := k.LocksID()
			ids[i] = fmt.Sprintf("(%d, %d, %d)", class, obj, sub)
		}
		if len(ids) == 0 {
			return false, false, nil
		}
		match = " AND (classid::bigint, objid::bigint, objsubid::int) IN (" + strings.Join(ids, ", ") + ")"
	}
	p := strconv.Itoa(int(r.Target.PID))
	// The quiet time as the server's clock has it: as long before the
	// statement's start as it is before now here (no clock is compared
	// with the other's).
	ago := func(t time.Time) string { return strconv.FormatInt(max(time.Since(t), 0).Microseconds(), 10) }
	q := `SELECT a.pid IS NOT NULL,
CASE WHEN a.pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_locks WHERE pid = ` + p + ` AND locktype = 'advisory'` + match + `)
THEN pg_terminate_backend(` + p + `) ELSE false END
FROM (SELECT 1) one LEFT JOIN pg_stat_activity a ON a.pid = ` + p + `
AND (extract(epoch FROM a.backend_start) * 1000000)::bigint::text || '@' || ` + serverStartExpr + ` = ` + "'" + r.Target.Incarnation + "'" + `
AND (coalesce(a.query_start <= statement_timestamp() - interval '` + ago(r.Target.Quiet) + ` microseconds', false)`
	var args []driver.NamedValue
	if r.Target.InFlight {
		// pg_stat_activity keeps the first track_activity_query_size bytes
		// of a text (1 kB by default).
		q += `
	OR coalesce(a.query_start <= statement_timestamp() - interval '` + ago(r.Target.SentQuiet) + ` microseconds', false)
	AND a.query <> '' AND (a.query = $1 OR (octet_length(a.query) >= 1000 AND starts_with($1, a.query)))`
		args = []driver.NamedValue{{Ordinal: 1, Value: r.Target.Sent}}
	}
	q += ")"
	row, err := side(ctx, q, args)
	if err != nil || len(row) != 2 {
		return false, false, err
	}
	alive, _ = row[0].(bool)
	ended, _ = row[1].(bool)
	return alive, ended, nil
}

package lockhooks

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// DebugHandler returns an http.Handler that shows, for each of dbs (opened
// through lockhooks), who holds which lock and who waits for whom inside
// this process, the way net/http/pprof shows goroutines. The page opens
// with a summary for the whole process (the longest waits with their
// holders, the holders that block the most waiters, a line per database),
// then each database, the busiest first:
//
//   - waits in progress: what each waits for, since when, from which call
//     site, and who holds it: the holder in this process, and on Postgres
//     the backends pg_blocking_pids names (pid, application_name, state,
//     transaction age, statement text), read on a side connection with a
//     short timeout each time the page loads;
//   - the wait-for graph, drawn as SVG (the waiters of one holder as one
//     node when there are many), with in-process cycles highlighted;
//   - held locks grouped by kind and namespace, counted, with the top rows
//     of each group: kind, mode, scope, namespace and key, connection and
//     backend pid, state (in use or parked), since when, the call site
//     that took it, how many times it is held and how many wait for it;
//   - the last events (lost locks, rerouted and refused unlocks, deadlocks,
//     writer-lock timeouts, long-held parked locks, slow waits, and the
//     retries and lock-order reports of the packages that make them) and
//     the counters behind the metrics.
//
// The page reloads itself every 2 seconds (?refresh=N sets N seconds, 0
// turns it off); ?format=json returns the same data as JSON, and
// ?format=json&db=I&kind=K&namespace=N&after=…&limit=L every held lock of
// a group, in key order, a page at a time. A load is bounded at any scale:
// it looks at each held lock once without allocating per lock, and
// formats only what it shows. Statement text is shown, bound arguments
// never are. Keys are shown by the names LockID made them from, and the
// advisory keys Lock takes on Postgres as Lock's namespace and ids (see
// LockID).
//
// Nothing is registered on any mux: mount the handler yourself, behind
// your service's own authentication, for the page shows statement text,
// call sites and application names:
//
//	mux.Handle("/debug/locks", requireAdmin(lockhooks.DebugHandler(db)))
//
// The first request resolves each database through one connection of its
// pool (kept only for the lookup); later requests use no pool connection.
func DebugHandler(dbs ...*sql.DB) http.Handler {
	return &debugHandler{dbs: dbs, conns: make([]*connector, len(dbs))}
}

// debugHandler serves DebugHandler.
type debugHandler struct {
	dbs []*sql.DB

	mu    sync.Mutex
	conns []*connector // resolved once per database
}

// debugResolveTimeout bounds the wait for a pool connection when the
// handler first resolves a database.
const debugResolveTimeout = 2 * time.Second

// debugRefresh is the page's default reload interval.
const debugRefresh = 2 * time.Second

func (h *debugHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	q := r.URL.Query()
	if q.Get("format") == "json" {
		var v any
		hq, isPage, err := parseHeldQuery(q, len(h.dbs))
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		case isPage:
			page, err := h.heldPage(r.Context(), hq)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			v = page
		default:
			v = h.report(r.Context())
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		return
	}
	report := h.report(r.Context())
	refresh := debugRefresh
	if s := q.Get("refresh"); s != "" {
		if n, err := strconv.ParseFloat(s, 64); err == nil && n >= 0 && n < 86400 {
			refresh = time.Duration(n * float64(time.Second))
		}
	}
	nonce := newNonce()
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-"+nonce+"'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := renderDebugHTML(w, report, refresh, nonce); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// newNonce returns a fresh CSP nonce for the page's one script.
func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawStdEncoding.EncodeToString(b[:])
}

// resolve returns the connector of database i.
func (h *debugHandler) resolve(ctx context.Context, i int) (*connector, error) {
	h.mu.Lock()
	c := h.conns[i]
	h.mu.Unlock()
	if c != nil {
		return c, nil
	}
	db := h.dbs[i]
	if db == nil {
		return nil, errors.New("lockhooks: DebugHandler was given a nil *sql.DB")
	}
	ctx, cancel := context.WithTimeout(ctx, debugResolveTimeout)
	defer cancel()
	sc, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("lockhooks: DebugHandler needs one pool connection the first time it shows a database: %w", err)
	}
	defer sc.Close()
	err = sc.Raw(func(dc any) error {
		w, ok := dc.(connCore)
		if !ok {
			return fmt.Errorf("lockhooks: DebugHandler shows databases opened through lockhooks; this one's connections are %T", dc)
		}
		c = w.state().connector
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.noteDB(db)
	h.mu.Lock()
	h.conns[i] = c
	h.mu.Unlock()
	return c, nil
}

// debugReport is the page's data, and the JSON of ?format=json.
type debugReport struct {
	Generated time.Time       `json:"generated"`
	Databases []debugDatabase `json:"databases"`
}

// debugDatabase is what one database shows.
type debugDatabase struct {
	Index   int      `json:"index"`
	Dialect string   `json:"dialect,omitempty"`
	Pool    string   `json:"pool,omitempty"`  // its pool name (WithPoolName), as holders name it
	Error   string   `json:"error,omitempty"` // the database could not be shown
	Notes   []string `json:"notes,omitempty"` // what could not be read this time
	// Held: the top rows of each group of held locks (HeldGroups), the
	// locks others wait for first, then the oldest; HeldTotal counts all.
	Held         []debugHeld      `json:"held"`
	HeldGroups   []debugHeldGroup `json:"held_groups"`
	HeldTotal    int              `json:"held_total"`
	Waiters      []debugWaiter    `json:"waiters"`       // the oldest waits in progress, at most debugMaxWaiters
	WaitersTotal int              `json:"waiters_total"` // all waits in progress
	Graph        debugGraph       `json:"graph"`
	Events       []debugEvent     `json:"events"`
	Counters     map[string]int64 `json:"counters"`
}

// debugHeld is one held lock.
type debugHeld struct {
	Kind        string    `json:"kind"`  // advisory | lockset | sqlite_writer
	Mode        string    `json:"mode"`  // exclusive | shared
	Scope       string    `json:"scope"` // session | transaction
	Namespace   string    `json:"namespace,omitempty"`
	Key         string    `json:"key"`                    // the lockset id, or the advisory key
	AdvisoryKey string    `json:"advisory_key,omitempty"` // Lock on Postgres: the advisory key it took for the id
	Name        string    `json:"name,omitempty"`         // the name LockID made the key from
	Conn        uint64    `json:"conn"`
	PID         int32     `json:"pid,omitempty"`
	State       string    `json:"state"` // in use | parked
	Since       time.Time `json:"since,omitzero"`
	HeldSeconds float64   `json:"held_seconds,omitempty"`
	Site        string    `json:"site,omitempty"` // where it was taken
	Statement   string    `json:"statement,omitempty"`
	Count       int       `json:"count"`             // re-entrant acquisitions
	Waiters     int       `json:"waiters,omitempty"` // waits in progress for it
}

// debugWaiter is one wait in progress.
type debugWaiter struct {
	Kind        string            `json:"kind"` // advisory | row | lockset | sqlite_writer | server
	Mode        string            `json:"mode,omitempty"`
	Scope       string            `json:"scope,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	Keys        string            `json:"keys,omitempty"`
	Conn        uint64            `json:"conn,omitempty"`
	PID         int32             `json:"pid,omitempty"`
	Since       time.Time         `json:"since,omitzero"`
	WaitSeconds float64           `json:"wait_seconds"`
	Site        string            `json:"site,omitempty"`      // where the wait was asked for
	Statement   string            `json:"statement,omitempty"` // statement text, never its arguments
	WaitEvent   string            `json:"wait_event,omitempty"`
	Holders     []holders.Holder  `json:"holders"`
	Blockers    []holders.Blocker `json:"blockers"`
	QueuedAhead int               `json:"queued_ahead,omitempty"` // backends queued ahead of it on the server (waiting themselves): at most maxQueuedListed are listed
}

// debugGraph is the wait-for graph: an edge from a waiter to what it
// waits for.
type debugGraph struct {
	Nodes []debugNode `json:"nodes"`
	Edges []debugEdge `json:"edges"`
	Cycle bool        `json:"cycle"` // an in-process cycle: these waits end only by timeout
}

// debugNode is a connection of the database, or a backend outside it.
type debugNode struct {
	ID       string `json:"id"` // "conn-N" or "pid-N"
	Label    string `json:"label"`
	Detail   string `json:"detail,omitempty"`
	External bool   `json:"external"`
}

// debugEdge is one wait-for relation.
type debugEdge struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Label   string `json:"label"`
	InCycle bool   `json:"in_cycle"`
}

// report gathers every database's state.
func (h *debugHandler) report(ctx context.Context) debugReport {
	rep := debugReport{Generated: time.Now().UTC()}
	for i := range h.dbs {
		c, err := h.resolve(ctx, i)
		if err != nil {
			rep.Databases = append(rep.Databases, debugDatabase{Index: i, Error: err.Error(),
				Held: []debugHeld{}, HeldGroups: []debugHeldGroup{}, Waiters: []debugWaiter{}, Events: []debugEvent{}, Counters: map[string]int64{}})
			continue
		}
		d := c.debugState(ctx, i)
		rep.Databases = append(rep.Databases, d)
	}
	return rep
}

// heldPage gathers one JSON page of one database's held locks.
func (h *debugHandler) heldPage(ctx context.Context, q *heldQuery) (debugHeldPage, error) {
	c, err := h.resolve(ctx, q.db)
	if err != nil {
		return debugHeldPage{}, err
	}
	now := time.Now()
	_, _, waited := c.waits.listBounded(0)
	hc := newHeldCollector(q)
	c.collectHeld(hc, c.openConns(), waited)
	return hc.heldPage(now, siteNames{}), nil
}

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

	"github.com/lockhooks/lockhooks/internal/debugpage"
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
		hq, isPage, err := debugpage.ParseQuery(q, len(h.dbs))
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
	if err := debugpage.Render(w, report, refresh, nonce); err != nil {
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

// report gathers every database's state.
func (h *debugHandler) report(ctx context.Context) debugpage.Report {
	rep := debugpage.Report{Generated: time.Now().UTC()}
	for i := range h.dbs {
		c, err := h.resolve(ctx, i)
		if err != nil {
			rep.Databases = append(rep.Databases, debugpage.Database{Index: i, Error: err.Error(),
				Held: []debugpage.Held{}, HeldGroups: []debugpage.Group{}, Waiters: []debugpage.Waiter{}, Events: []holders.Event{}, Counters: map[string]int64{}})
			continue
		}
		d := c.State(ctx, i, blockerLookupTimeout)
		rep.Databases = append(rep.Databases, d)
	}
	return rep
}

// heldPage gathers one JSON page of one database's held locks.
func (h *debugHandler) heldPage(ctx context.Context, q *debugpage.Query) (debugpage.HeldPage, error) {
	c, err := h.resolve(ctx, q.DB)
	if err != nil {
		return debugpage.HeldPage{}, err
	}
	return c.HeldPage(q), nil
}

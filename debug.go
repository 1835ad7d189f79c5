package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks/internal/debugpage"
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
	r := &debugResolver{dbs: dbs, conns: make([]*connector, len(dbs))}
	return &debugpage.Handler{N: len(dbs), Resolve: r.source, Lookup: blockerLookupTimeout, Refresh: debugRefresh}
}

// debugResolver finds the databases of DebugHandler, each once.
type debugResolver struct {
	dbs []*sql.DB

	mu    sync.Mutex
	conns []*connector // resolved once per database
}

// debugResolveTimeout bounds the wait for a pool connection when the
// handler first resolves a database.
const debugResolveTimeout = 2 * time.Second

// debugRefresh is the page's default reload interval.
const debugRefresh = 2 * time.Second

// source returns database i as the page reads it.
func (h *debugResolver) source(ctx context.Context, i int) (debugpage.Source, error) {
	c, err := h.resolve(ctx, i)
	if err != nil {
		return nil, err
	}
	return &c.DB, nil
}

// resolve returns the connector of database i.
func (h *debugResolver) resolve(ctx context.Context, i int) (*connector, error) {
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

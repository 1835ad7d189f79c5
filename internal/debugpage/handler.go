package debugpage

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
)

// Source is one database as the page reads it: its snapshot for a page
// load (index is its place among the handler's databases; lookup bounds
// its reads of the server) and one JSON page of its held locks.
type Source interface {
	State(ctx context.Context, index int, lookup time.Duration) Database
	HeldPage(q *Query) HeldPage
}

// Handler serves the page of N databases: HTML, reloading itself every
// Refresh (?refresh=N sets N seconds, 0 turns it off), or JSON
// (?format=json, and one page of a group of held locks with db, kind,
// namespace, after and limit: [ParseQuery]).
type Handler struct {
	// N is the number of databases the page shows.
	N int
	// Resolve returns database i (0 ≤ i < N), or why it cannot be shown
	// (the page shows the error in its place).
	Resolve func(ctx context.Context, i int) (Source, error)
	// Lookup bounds one database's reads of the server per load.
	Lookup time.Duration
	// Refresh is the page's default reload interval.
	Refresh time.Duration
}

// ServeHTTP serves GET and HEAD: the JSON a query asks for, or the page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		hq, isPage, err := ParseQuery(q, h.N)
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
			v = h.Report(r.Context())
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		return
	}
	report := h.Report(r.Context())
	refresh := h.Refresh
	if s := q.Get("refresh"); s != "" {
		if n, err := strconv.ParseFloat(s, 64); err == nil && n >= 0 && n < 86400 {
			refresh = time.Duration(n * float64(time.Second))
		}
	}
	nonce := newNonce()
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-"+nonce+"'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := Render(w, report, refresh, nonce); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// newNonce returns a fresh CSP nonce for the page's one script.
func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawStdEncoding.EncodeToString(b[:])
}

// Report gathers every database's state; a database that cannot be
// resolved has its error in its place, with empty lists.
func (h *Handler) Report(ctx context.Context) Report {
	rep := Report{Generated: time.Now().UTC()}
	for i := range h.N {
		s, err := h.Resolve(ctx, i)
		if err != nil {
			rep.Databases = append(rep.Databases, Database{Index: i, Error: err.Error(),
				Held: []Held{}, HeldGroups: []Group{}, Waiters: []Waiter{}, Events: []holders.Event{}, Counters: map[string]int64{}})
			continue
		}
		rep.Databases = append(rep.Databases, s.State(ctx, i, h.Lookup))
	}
	return rep
}

// heldPage gathers one JSON page of one database's held locks.
func (h *Handler) heldPage(ctx context.Context, q *Query) (HeldPage, error) {
	s, err := h.Resolve(ctx, q.DB)
	if err != nil {
		return HeldPage{}, err
	}
	return s.HeldPage(q), nil
}

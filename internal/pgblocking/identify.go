package pgblocking

import (
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

// HolderOf is identity id, as another process (or a connection of this
// one closed since) published it, as a holder of the model: the process,
// database and connection it names, where and since when it took its
// session lock (its key named by describe), or where its transaction
// began (whose start the server's xact_start says), and its trace.
func HolderOf(id *identity.Holder, describe func(advisorykey.Key) string) holders.Holder {
	h := holders.Holder{Process: id.Process, Database: id.Pool, Conn: id.Conn, Site: id.Site, TraceID: id.TraceID, Span: id.SpanContext()}
	if id.Pool == "" {
		h.DatabaseNumber = id.Database
	}
	switch {
	case id.Holds == "tx":
		h.SiteKind = holders.SiteBegan
	case strings.HasPrefix(id.Holds, "lock"):
		h.SiteKind, h.Since = holders.SiteTook, id.Since
		if k, ok := advisorykey.ParseToken(strings.TrimSpace(strings.TrimPrefix(id.Holds, "lock"))); ok {
			h.Key = describe(k)
		}
	}
	if h.Site == "" {
		h.SiteKind = holders.SiteNone
	}
	return h
}

// Identify returns the holder that backend s, which the server showed
// blocking a wait, is when it is a connection of a lockhooks database: of
// this process, as ours names it (all the model knows of it: the lock it
// holds, where and when it took it, or its transaction; false when the
// backend is none of this process's connections), or of another, as it
// published itself (HolderOf). ok is false for a backend nobody
// identified. The server's view completes the holder: its pid, state and
// depth, the statement it waits in, and, where the holder says none, how
// long its transaction has run.
func Identify(s holders.Blocker, ours func() (holders.Holder, bool), describe func(advisorykey.Key) string) (h holders.Holder, ok bool) {
	id := identity.Decode(s.ApplicationName, s.Query)
	ownStatement := id != nil && identity.ParseAnnotation(s.Query) != nil // lockhooks' own read, not the application's
	if h, ok = ours(); ok {
		if h.SiteKind != holders.SiteTook && !ownStatement {
			// The last statement of a transaction tells where it is; that of
			// a session-lock holder is often lockhooks' own pg_locks read.
			h.Statement = s.Query
		}
	} else if id != nil {
		h = HolderOf(id, describe)
		if h.SiteKind == holders.SiteTook && h.Since.IsZero() && ownStatement && s.State != "active" && s.StateSeconds > 0 {
			// Its last statement is the lock statement that took the lock,
			// which names no since (pgsession.Conn.LockText): held since that
			// statement ended.
			h.Since = time.Now().Add(-time.Duration(s.StateSeconds * float64(time.Second)))
		}
		if id.OfThisProcess() {
			h.Process = "" // a connection closed since
		}
		if h.SiteKind != holders.SiteTook && !ownStatement {
			h.Statement = s.Query
		}
	} else {
		return holders.Holder{}, false
	}
	h.PID, h.State, h.Depth = s.PID, s.State, s.Depth
	if s.Waiting {
		h.Queued, h.WaitSeconds, h.Statement = true, s.WaitSeconds, s.Query
	}
	if h.Since.IsZero() && s.XactSeconds >= 0 {
		h.Since = time.Now().Add(-time.Duration(s.XactSeconds * float64(time.Second)))
	}
	return h, true
}

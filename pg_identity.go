package lockhooks

import (
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

// A holder's identity across processes (Postgres): how it is encoded in
// application_name and in the comment on lockhooks' own statements is
// internal/identity's; it is written only into statements that run anyway
// (see pg_identity_publish.go) and decoded by the waiters' blocker reads
// (see pg_blockers.go). What stays here turns a decoded identity into the
// model's holder and its key.

// holderOf is identity id as a holder of the model (internal/holders): the
// process, database and connection it names, where and since when it took
// its session lock, or where its transaction began (whose start the
// server's xact_start says), and its trace.
func holderOf(id *identity.Holder) holders.Holder {
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
			h.Key = lockKey(k).String()
		}
	}
	if h.Site == "" {
		h.SiteKind = holders.SiteNone
	}
	return h
}

package lockhooks

// A wait's blockage (holders.Blockage): the backends the server showed,
// identified as the model's holders where they are connections of
// lockhooks databases, of this process or another.

import (
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

// addBlockers adds to b the backends Postgres showed blocking a wait for
// keys, each identified as a holder where it is a connection of a
// lockhooks database (identify).
func addBlockers(b *holders.Blockage, server []holders.Blocker, keys []lockKey) {
	b.Add(server, func(s holders.Blocker) (holders.Holder, bool) { return identify(s, keys) })
}

// identify returns the holder that backend s is, when it is a connection
// of a lockhooks database: of this process (all the model knows of it:
// the lock among keys it holds, where and when it took it, or its
// transaction), or of another (as it published itself). ok is false for a
// backend nobody identified.
func identify(s holders.Blocker, keys []lockKey) (h holders.Holder, ok bool) {
	id := identity.Decode(s.ApplicationName, s.Query)
	ownStatement := id != nil && identity.ParseAnnotation(s.Query) != nil // lockhooks' own read, not the application's
	seenBy, _ := s.SeenBy.(*connector)
	switch oc := databases.connOf(s.PID, s.ApplicationName, s.Query, seenBy); {
	case oc != nil:
		h = oc.asHolder(keys)
		if h.SiteKind != holders.SiteTook && !ownStatement {
			// The last statement of a transaction tells where it is; that of
			// a session-lock holder is often lockhooks' own pg_locks read.
			h.Statement = s.Query
		}
	case id != nil:
		h = holderOf(id)
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
	default:
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

package lockhooks

// A wait's blockage: the holders the model named and the backends nobody
// identified, as the server showed them, with the root of the chain and the
// waiters queued ahead.

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

// blockage is who holds what a wait waits for, as the model names it:
// the holders (connections of lockhooks databases, here or in other
// processes), the backends nobody identified, and what the server showed.
// The slow-wait log, errors, spans and the page only format it.
type blockage struct {
	holders  []holders.Holder  // the holders at the root first, then those queued ahead of the wait
	blockers []holders.Blocker // backends no lockhooks identified, the root first
	server   []holders.Blocker // every backend of the chain, as Postgres showed it (nil: not read)
	queued   int               // how many backends block the wait directly while waiting themselves, listed in server or not (pgserver.MaxQueuedListed)
	err      error             // reading the server failed
	at       time.Time         // when it was read
}

// empty reports whether nobody was found.
func (b *blockage) empty() bool { return b == nil || len(b.holders)+len(b.blockers) == 0 }

// add identifies the backends Postgres showed blocking a wait for keys:
// each one that is a connection of a lockhooks database becomes a holder
// (unless already named), the others stay blockers; holders at the root
// come before queued ones.
func (b *blockage) add(server []holders.Blocker, keys []lockKey) {
	b.server = append(b.server, server...)
	for _, s := range server {
		h, ok := identify(s, keys)
		if !ok {
			b.blockers = append(b.blockers, s)
			continue
		}
		if !slices.ContainsFunc(b.holders, h.SameConnection) {
			b.holders = append(b.holders, h)
		}
	}
	sort.SliceStable(b.holders, func(i, j int) bool { return !b.holders[i].Queued && b.holders[j].Queued })
	sort.SliceStable(b.blockers, func(i, j int) bool { return !b.blockers[i].Waiting && b.blockers[j].Waiting })
}

// root is the holder at the root, the first one not queued.
func (b *blockage) root() (holders.Holder, bool) {
	for _, h := range b.holders {
		if !h.Queued {
			return h, true
		}
	}
	return holders.Holder{}, false
}

// rootBlocker is the first blocker not waiting itself.
func (b *blockage) rootBlocker() (holders.Blocker, bool) {
	for _, x := range b.blockers {
		if !x.Waiting {
			return x, true
		}
	}
	return holders.Blocker{}, false
}

// aged is b with the ages the server gave brought up to now (the holders'
// ages count from their Since).
func (b *blockage) aged() *blockage {
	d := time.Since(b.at).Seconds()
	out := *b
	out.holders = slices.Clone(b.holders)
	for i := range out.holders {
		if out.holders[i].Queued && out.holders[i].WaitSeconds > 0 {
			out.holders[i].WaitSeconds += d
		}
	}
	out.blockers = slices.Clone(b.blockers)
	for i := range out.blockers {
		out.blockers[i] = out.blockers[i].Aged(d)
	}
	return &out
}

// String is the holder part of a slow-wait line or an error: the holders
// at the root, then the backends queued ahead of the wait.
func (b *blockage) String() string {
	var parts, queued []string
	for _, h := range b.holders {
		if h.Queued {
			queued = append(queued, h.String())
		} else {
			parts = append(parts, h.String())
		}
	}
	for _, x := range b.blockers {
		if x.Waiting {
			queued = append(queued, x.String())
		} else {
			parts = append(parts, x.String())
		}
	}
	if len(queued) > 0 {
		parts = append(parts, "queued ahead of this wait, waiting too: "+strings.Join(queued, "; "))
	}
	if n := b.queuedUnlisted(); n > 0 {
		parts = append(parts, fmt.Sprintf("and %d more queued ahead (not listed)", n))
	}
	if b.err != nil {
		parts = append(parts, "(reading pg_blocking_pids failed: "+b.err.Error()+")")
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, "; ")
}

// queuedUnlisted is how many of the backends queued ahead of the wait
// the server's read counted but did not list (pgserver.MaxQueuedListed).
func (b *blockage) queuedUnlisted() int {
	n := b.queued
	for _, s := range b.server {
		if s.Waiting && s.Depth == 1 {
			n--
		}
	}
	return max(n, 0)
}

// logArgs are the slow-wait line's attributes of the holder at the root,
// the backends nobody identified that block the wait directly
// (blocking_pids) and the backends queued ahead (queued_pids).
func (b *blockage) logArgs() []any {
	text := b.String()
	var args []any
	if h, ok := b.root(); ok {
		args = h.LogArgs()
		if len(b.holders) > 1 || len(b.blockers) > 0 {
			args = append(args, "holders", text)
		}
	} else {
		args = []any{"holder", text}
		if x, ok := b.rootBlocker(); ok {
			args = append(args, "holder_pid", x.PID)
			if x.XactSeconds >= 0 {
				args = append(args, "holder_age", time.Duration(x.XactSeconds*float64(time.Second)).Round(time.Millisecond).String())
			}
		}
	}
	var direct, queued []string
	for _, x := range b.blockers {
		if x.Depth <= 1 {
			direct = append(direct, strconv.Itoa(int(x.PID)))
		}
	}
	for _, s := range b.server {
		if s.Waiting {
			queued = append(queued, strconv.Itoa(int(s.PID)))
		}
	}
	if len(direct) > 0 {
		args = append(args, "blocking_pids", strings.Join(direct, ","))
	}
	if len(queued) > 0 {
		args = append(args, "queued_pids", strings.Join(queued, ","))
	}
	return args
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
			// which names no since (annotatedLockText): held since that
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

package lockhooks

// What the page's collector (debugpage.Collector) is fed from the model:
// the held locks of the lock tables, read under their mutexes, and the
// waits in progress; and how the page names what it keeps (pageNames).

import (
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// collectHeld offers every lock the database holds to hc: Postgres
// advisory keys per connection (a key Lock made shown as Lock's namespace
// and id), SQLite's advisory locks and locksets, and the writer lock.
// waited counts the waits in progress per Postgres advisory key.
func (c *connector) collectHeld(hc *debugpage.Collector, conns []*conn, waited map[lockKey]int) {
	var cand debugpage.Candidate
	if c.pins != nil {
		for _, oc := range conns {
			if hc.Full() {
				break
			}
			oc.pin.Lock()
			state := "in use"
			if oc.pin.Parked {
				state = "parked"
			}
			pid := oc.LockPID()
			if oc.pin.Hold.PID() != 0 {
				state += ", pooler holder"
			}
			for k, l := range oc.pin.Held {
				cand = debugpage.Candidate{Mode: modeOf(k), Scope: "session", Conn: oc.id, PID: pid, State: state,
					Since: l.Since, Site: l.Site, Count: l.Count, Waiters: waited[k.exclusive()]}
				advisoryCandidate(&cand, k.exclusive())
				hc.Offer(&cand)
			}
			for k, n := range oc.pin.Xact {
				if hc.Full() {
					break
				}
				cand = debugpage.Candidate{Mode: modeOf(k), Scope: "transaction", Conn: oc.id, PID: pid, State: state,
					Since: oc.pin.XactSince, Site: oc.pin.XactSite, Stack: &oc.pin.XactPCs, Count: n, Waiters: waited[k.exclusive()]}
				advisoryCandidate(&cand, k.exclusive())
				hc.Offer(&cand)
			}
			oc.pin.Unlock()
		}
	}
	c.named.EachHeld(func(key int64, e *sqlitelock.Hold[inprocess.Taker]) bool {
		cand = debugpage.Candidate{Kind: "advisory", Mode: "exclusive", Scope: "session", State: "in use", Key: advisorykey.Key{K1: key}, Advisory: true,
			Since: e.Since(), Stack: e.Site(), Count: e.Count(), Waiters: e.Waiters()}
		ownerOf(&cand, e.Owner())
		hc.Offer(&cand)
		return !hc.Full()
	})
	c.locksets.EachHeld(func(key inprocess.LocksetKey, e *sqlitelock.Hold[inprocess.Taker]) bool {
		cand = debugpage.Candidate{Kind: "lockset", Mode: "exclusive", Scope: "transaction", State: "in use", Namespace: key.Namespace, ID: key.ID,
			Since: e.Since(), Stack: e.Site(), Count: e.Count(), Waiters: e.Waiters()}
		ownerOf(&cand, e.Owner())
		hc.Offer(&cand)
		return !hc.Full()
	})
	if wh, ok := inprocess.WriterHolderOf(&c.writer.core); ok {
		cand = debugpage.Candidate{Kind: "sqlite_writer", Mode: "exclusive", Scope: "transaction", State: "in use",
			Since: wh.Since, Count: 1, Waiters: c.writer.core.Waiting()}
		if wh.Stmt != "" {
			cand.Scope, cand.Statement = "statement", wh.Stmt
		} else {
			cand.Site = wh.Location()
		}
		ownerOf(&cand, wh.Owner)
		hc.Offer(&cand)
	}
}

// ownerOf fills the connection of a held lock's owner.
func ownerOf(c *debugpage.Candidate, owner any) {
	if oc := ownerConn(owner); oc != nil {
		c.Conn, c.PID = oc.id, oc.pin.PID.Load()
	}
}

func modeOf(k lockKey) string {
	if k.Shared {
		return "shared"
	}
	return "exclusive"
}

// advisoryCandidate fills the key fields of a Postgres advisory key: a key
// made by Lock is shown as Lock's namespace and id. It reads the name
// memory without allocating.
func advisoryCandidate(c *debugpage.Candidate, k lockKey) {
	c.Key, c.Advisory, c.Kind, c.Namespace, c.ID = advisorykey.Key(k), true, "advisory", "", ""
	if k.Pair {
		return
	}
	if name, ok := keyNames.Lookup(k.K1); ok {
		if i := strings.IndexByte(name, 0); i >= 0 && lockset.ValidID(name[i+1:]) {
			c.Kind, c.Namespace, c.ID = "lockset", name[:i], name[i+1:]
		}
	}
}

// listWaits returns the first n waits in progress (the oldest; n < 0:
// all), how many there are in all, and how many of them wait for each Postgres advisory
// key.
func (c *connector) listWaits(n int) ([]waitView, int, map[lockKey]int) {
	var keys map[lockKey]int
	out, total := c.waits.ListBounded(n, func(ks []lockKey) {
		for _, k := range ks {
			if keys == nil {
				keys = map[lockKey]int{}
			}
			keys[k.exclusive()]++
		}
	})
	return out, total, keys
}

// pageNames names the rows a page load keeps (debugpage.Names): call
// sites symbolised once per load, lockset ids and advisory keys as the
// rest of lockhooks shows them.
type pageNames struct{ sites inprocess.SiteNames }

func newPageNames() pageNames { return pageNames{sites: inprocess.SiteNames{}} }

func (n pageNames) Site(s *callsite.Stack) string { return n.sites.Of(s) }

func (pageNames) ID(cid string) string { return lockset.DescribeID(cid) }

func (pageNames) StringID(cid string) (string, bool) {
	if cid != "" && cid[0] == lockset.TagString {
		return cid[1:], true
	}
	return "", false
}

func (pageNames) KeyName(k1 int64) (string, bool) {
	o, ok := keyNames.Origin(k1)
	if !ok {
		return "", false
	}
	return o.Label(), true
}

package lockdb

// What the page's collector (debugpage.Collector) is fed: the held locks
// of the connections and the lock tables, read under their mutexes; and
// how the page names what it keeps (pageNames).

import (
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/debugpage"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/keynames"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// collectHeld offers every lock the database holds to hc: Postgres
// advisory keys per connection (a key Lock made shown as Lock's namespace
// and id), SQLite's advisory locks and locksets, and the writer lock.
// waited counts the waits in progress per Postgres advisory key.
func (db *DB[C, K]) collectHeld(hc *debugpage.Collector, conns []C, waited map[K]int) {
	var cand debugpage.Candidate
	if db.postgres() {
		for _, oc := range conns {
			if hc.Full() {
				break
			}
			pin := oc.Pin()
			pin.Lock()
			state := "in use"
			if pin.Parked {
				state = "parked"
			}
			pid := pin.LockPID()
			if pin.Hold.PID() != 0 {
				state += ", pooler holder"
			}
			for k, l := range pin.Held {
				cand = debugpage.Candidate{Mode: modeOf(k), Scope: "session", Conn: oc.ID(), PID: pid, State: state,
					Since: l.Since, Site: l.Site, Count: l.Count, Waiters: waited[advisorykey.Exclusive(k)]}
				db.advisoryCandidate(&cand, advisorykey.Exclusive(k))
				hc.Offer(&cand)
			}
			for k, n := range pin.Xact {
				if hc.Full() {
					break
				}
				cand = debugpage.Candidate{Mode: modeOf(k), Scope: "transaction", Conn: oc.ID(), PID: pid, State: state,
					Since: pin.XactSince, Site: pin.XactSite, Stack: &pin.XactPCs, Count: n, Waiters: waited[advisorykey.Exclusive(k)]}
				db.advisoryCandidate(&cand, advisorykey.Exclusive(k))
				hc.Offer(&cand)
			}
			pin.Unlock()
		}
	}
	db.Named.EachHeld(func(key int64, e *sqlitelock.Hold[inprocess.Taker]) bool {
		cand = debugpage.Candidate{Kind: "advisory", Mode: "exclusive", Scope: "session", State: "in use", Key: advisorykey.Key{K1: key}, Advisory: true,
			Since: e.Since(), Stack: e.Site(), Count: e.Count(), Waiters: e.Waiters()}
		db.ownerOf(&cand, e.Owner())
		hc.Offer(&cand)
		return !hc.Full()
	})
	db.Locksets.EachHeld(func(key inprocess.LocksetKey, e *sqlitelock.Hold[inprocess.Taker]) bool {
		cand = debugpage.Candidate{Kind: "lockset", Mode: "exclusive", Scope: "transaction", State: "in use", Namespace: key.Namespace, ID: key.ID,
			Since: e.Since(), Stack: e.Site(), Count: e.Count(), Waiters: e.Waiters()}
		db.ownerOf(&cand, e.Owner())
		hc.Offer(&cand)
		return !hc.Full()
	})
	if wh, ok := inprocess.WriterHolderOf(db.Writer); ok {
		cand = debugpage.Candidate{Kind: "sqlite_writer", Mode: "exclusive", Scope: "transaction", State: "in use",
			Since: wh.Since, Count: 1, Waiters: db.Writer.Waiting()}
		if wh.Stmt != "" {
			cand.Scope, cand.Statement = "statement", wh.Stmt
		} else {
			cand.Site = wh.Location()
		}
		db.ownerOf(&cand, wh.Owner)
		hc.Offer(&cand)
	}
}

// ownerOf fills the connection of a held lock's owner.
func (db *DB[C, K]) ownerOf(c *debugpage.Candidate, owner any) {
	var none C
	if oc := db.OwnerConn(owner); oc != none {
		c.Conn, c.PID = oc.ID(), oc.PID()
	}
}

// advisoryCandidate fills the key fields of a Postgres advisory key: a key
// made by Lock is shown as Lock's namespace and id. It reads the name
// memory without allocating.
func (db *DB[C, K]) advisoryCandidate(c *debugpage.Candidate, k K) {
	key := advisorykey.Key(k)
	c.Key, c.Advisory, c.Kind, c.Namespace, c.ID = key, true, "advisory", "", ""
	if key.Pair {
		return
	}
	if name, ok := db.Names.Lookup(key.K1); ok {
		if i := strings.IndexByte(name, 0); i >= 0 && lockset.ValidID(name[i+1:]) {
			c.Kind, c.Namespace, c.ID = "lockset", name[:i], name[i+1:]
		}
	}
}

// pageNames names the rows a page load keeps (debugpage.Names): call
// sites symbolised once per load, lockset ids and advisory keys as the
// rest of lockhooks shows them.
type pageNames struct {
	sites inprocess.SiteNames
	names *keynames.Memory
}

func (db *DB[C, K]) pageNames() pageNames {
	return pageNames{sites: inprocess.SiteNames{}, names: db.Names}
}

func (n pageNames) Site(s *callsite.Stack) string { return n.sites.Of(s) }

func (pageNames) ID(cid string) string { return lockset.DescribeID(cid) }

func (pageNames) StringID(cid string) (string, bool) {
	if cid != "" && cid[0] == lockset.TagString {
		return cid[1:], true
	}
	return "", false
}

func (n pageNames) KeyName(k1 int64) (string, bool) {
	o, ok := n.names.Origin(k1)
	if !ok {
		return "", false
	}
	return o.Label(), true
}

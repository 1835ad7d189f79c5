package holding

import (
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
)

// Key is an advisory key as the adapter keys its connections' locks:
// [advisorykey.Key], or a type defined over it that names a key for a
// reader (String).
type Key = advisorykey.Named

// Conn is one connection of this process as the model reads it.
type Conn[K Key] interface {
	comparable
	// Identity is the connection as a holder, without what it holds: its
	// database, its number, its backend pid.
	Identity() holders.Holder
	// Locks is its session-lock tracking, nil where its database tracks
	// none (SQLite).
	Locks() Locks[K]
	// Transaction is its open transaction's identity.
	Transaction() *Tx
	// Run is RunInTx's fn whose transaction it runs, or nil.
	Run() *callsite.Run
}

// Locks is a connection's advisory locks as the session-lock machine
// keeps them, read under its mutex (Lock, Unlock).
type Locks[K Key] interface {
	Lock()
	Unlock()
	// TookLocked reports where and when the connection took the session
	// lock of k, in k's mode exactly, if it holds it.
	TookLocked(k K) (site string, since time.Time, span trace.SpanContext, ok bool)
	// HoldsXactLocked reports whether its transaction holds k, in k's
	// mode exactly, at transaction level.
	HoldsXactLocked(k K) bool
}

// Conflicting returns the modes of k's key that conflict with a request
// for k: both for an exclusive request, the exclusive one for a shared.
func Conflicting[K Key](k K) []K {
	ex := advisorykey.Exclusive(k)
	if advisorykey.Key(k).Shared {
		return []K{ex}
	}
	return []K{ex, K(advisorykey.Key(k).SharedMode())}
}

// Of is connection c as the holder of what a waiter for keys waits for:
// the session lock it holds that conflicts with one of keys (where and
// when it took it), else its open transaction (where and when it began),
// else its identity alone.
func Of[C Conn[K], K Key](c C, keys []K) holders.Holder {
	h := c.Identity()
	if l := c.Locks(); l != nil {
		l.Lock()
		for _, k := range keys {
			for _, hk := range Conflicting(k) {
				if site, since, span, ok := l.TookLocked(hk); ok && h.SiteKind == holders.SiteNone {
					h = h.TookLock(hk.String(), site, since, span)
				}
			}
		}
		l.Unlock()
		if h.SiteKind != holders.SiteNone {
			return h
		}
	}
	since, site, span, _, open := c.Transaction().Snapshot()
	if open {
		h.Since, h.SiteKind = since, holders.SiteBegan
		if site.Recorded() {
			h.Site = site.String()
		}
		h = h.WithSpan(span)
	}
	return h
}

// Among returns, of conns, those other than except that hold k or a
// session lock that conflicts with it, each as the holder of that lock.
func Among[C Conn[K], K Key](conns []C, k K, except C) []holders.Holder {
	var out []holders.Holder
	for _, c := range conns {
		if c == except {
			continue
		}
		l := c.Locks()
		if l == nil {
			continue
		}
		l.Lock()
		for _, hk := range Conflicting(k) {
			if site, since, span, ok := l.TookLocked(hk); ok {
				out = append(out, c.Identity().TookLock(hk.String(), site, since, span))
			}
		}
		l.Unlock()
	}
	return out
}

// HeldAmong returns a mode of one of keys that c holds and that conflicts
// with the request for it, at session or transaction level (the last such
// one found), if any.
func HeldAmong[C Conn[K], K Key](c C, keys []K) (held K, ok bool) {
	l := c.Locks()
	if l == nil {
		return held, false
	}
	l.Lock()
	for _, k := range keys {
		for _, hk := range Conflicting(k) {
			if _, _, _, s := l.TookLocked(hk); s || l.HoldsXactLocked(hk) {
				held, ok = hk, true
			}
		}
	}
	l.Unlock()
	return held, ok
}

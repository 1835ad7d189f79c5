package inprocess

import (
	"errors"
	"fmt"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// Owners names a lock's owner (the caller's value: a connection, a
// transaction, an advisory lock) as a holder: its database, connection
// and backend, without what it holds; the zero Holder when it names none.
type Owners func(owner any) holders.Holder

// Holder is the identity of a table's holder of key (named for a
// reader), its call sites symbolised through sites when not nil (a page
// or a list of many waiters shares sites).
func (o Owners) Holder(key string, h Holder, sites SiteNames) holders.Holder {
	var site string
	if h.Site.Recorded() {
		if sites != nil {
			site = sites.Of(&h.Site)
		} else {
			site = h.Site.String()
		}
	}
	return o(h.Owner).TookLock(key, site, h.Since, h.Span)
}

// ExplainWait turns a *sqlitelock.WaitError of a table wait for key (named
// by what) into the caller's error: a self-wait (wrapping ErrSelfWait), or
// how long the caller (waiter) waited and who holds the key, wrapping the
// context's error. Other errors are returned unchanged.
func (o Owners) ExplainWait(err error, waiter, what, key string) error {
	var tw *sqlitelock.WaitError[Taker]
	if !errors.As(err, &tw) {
		return err
	}
	h := o.Holder(key, holderOf(&tw.Holder), nil)
	if tw.Self {
		return SelfWaitError(waiter, what, h)
	}
	hint := ""
	if tw.Hint != "" {
		hint = " (" + tw.Hint + ")"
	}
	if h.Conn == 0 && h.Since.IsZero() { // freed meanwhile
		return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v%s: %w", waiter, what, tw.Waited.Round(time.Millisecond), hint, tw.Err)
	}
	return fmt.Errorf("lockhooks: %s gave up waiting for %s after %v; it is held by %s%s: %w", waiter, what, tw.Waited.Round(time.Millisecond), h, hint, tw.Err)
}

// SiteNames symbolises call sites once per page load or list: the
// waiters of one hot lock were mostly asked for at the same place.
type SiteNames map[callsite.Stack]string

// Of returns the name of the call site s, "unknown" when not recorded.
func (n SiteNames) Of(s *callsite.Stack) string {
	if !s.Recorded() {
		return "unknown"
	}
	if name, ok := n[*s]; ok {
		return name
	}
	name := s.String()
	n[*s] = name
	return name
}

// KeyName names a key for messages: a lockset id as namespace / id, else
// the key as given. The one place names for keys plug in.
func KeyName(namespace, key string) string {
	if namespace != "" {
		return namespace + " / " + key
	}
	return key
}

package pgsession

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgserver"
)

// A connection's identity as other processes see it (internal/identity
// encodes it). It is written only into statements that run anyway, so
// that no statement path gains a round trip: a transaction's rides on its
// BEGIN (TxAppName), a session lock's on the statement that leaves it
// held (LockText) or on the pg_locks read that follows it
// (OwnLocksQuery), and on COMMIT, ROLLBACK and the fencing-token read
// (Note) while the connection holds session locks. Which statements those
// are, and whether the driver can run such texts uncached, is the
// caller's; the texts are composed here.

// Identity is what a connection shows other processes of itself: its
// base, and whether it publishes an application_name of its own. Base is
// set when the connection is made and Publishes and ConnectApp when it
// opens, before any other goroutine can see it; nothing changes them
// after.
type Identity struct {
	// Base names the connection's process, database (its number and
	// pool name, made safe for the encoding) and connection number; the
	// rest is empty.
	Base identity.Holder
	// Publishes: the connection's application_name was the user's to
	// set, and the user set none (empty at connect, or lockhooks' own).
	Publishes bool
	// ConnectApp is its application_name at connect.
	ConnectApp string
}

// NewIdentity returns the base identity of connection conn of database
// number db, named pool, in this process.
func NewIdentity(db uint64, pool string, conn uint64) Identity {
	return Identity{Base: identity.Holder{Process: identity.ProcessLabel(), Database: db,
		Pool: identity.SafeToken(pool, "_"), Conn: conn}}
}

// holding sets id's lock fields to a session lock of key k taken at site,
// since since, in span.
func holding(id *identity.Holder, k advisorykey.Key, site string, since time.Time, span trace.SpanContext) {
	var holds [48]byte
	id.Holds = string(k.AppendToken(append(holds[:0], "lock "...)))
	id.Site, id.Since = identity.SafeToken(site, "_"), since
	id.TraceID, id.SpanID = identity.TraceIDs(span)
}

// IdentityIntoLocked sets *id to the connection's identity as a holder of
// session locks (its oldest), leaving out the lock of key skip (if not
// nil), and reports whether it holds any other. State is locked.
func (c *Conn[K]) IdentityIntoLocked(id *identity.Holder, skip *K) bool {
	key, oldest := c.OldestLocked(skip)
	if oldest == nil {
		return false
	}
	*id = c.Who.Base
	holding(id, advisorykey.Key(key), oldest.Site, oldest.Since, oldest.Span)
	return true
}

// IdentityLocked is IdentityIntoLocked's identity, nil when the
// connection holds no other lock than skip's. State is locked.
func (c *Conn[K]) IdentityLocked(skip *K) *identity.Holder {
	id := new(identity.Holder)
	if !c.IdentityIntoLocked(id, skip) {
		return nil
	}
	return id
}

// TxAppName is the application_name of the connection's transaction
// begun at site.
func (c *Conn[K]) TxAppName(site string) string {
	id := c.Who.Base
	id.Holds, id.Site = "tx", identity.SafeToken(site, "_")
	return id.AppName()
}

// Note is the annotation that names the connection as the holder of its
// session locks on a statement of lockhooks' own run on its backend, as
// they will be once the lock of key skip (if not nil) is released; ""
// when it holds no other.
func (c *Conn[K]) Note(skip *K) string {
	c.Lock()
	id := c.IdentityLocked(skip)
	c.Unlock()
	if id == nil {
		return ""
	}
	return id.Annotation()
}

// LockText is text, an exact session-lock statement of one call (of key
// k, an unlock or not, at site, in ctx's span) on a connection that
// reaches the server itself, beginning with the annotation that names the
// connection as the holder of its session locks as the statement leaves
// them; "" when it leaves none (an unlock of the last one: the text stays
// the user's); suffix ends it.
//
// The lock it takes names no since: it is held from the statement's end,
// which the server shows (pg_stat_activity's state_change), not from its
// start (a lock may wait), and a text without a time can be the same at
// every hold.
func (c *Conn[K]) LockText(ctx context.Context, unlock bool, k K, site, text, suffix string) string {
	var id identity.Holder
	c.Lock()
	var skip *K
	if l := c.Held[k]; unlock && l != nil && l.Count <= 1 {
		skip = &k
	}
	holds := c.IdentityIntoLocked(&id, skip)
	c.Unlock()
	if !holds {
		if unlock {
			return ""
		}
		// Written out here rather than through holding: on a local id the
		// compiler keeps the Holds string on the stack, through a pointer
		// it escapes (an allocation per lock statement).
		id = c.Who.Base
		var holds [48]byte
		id.Holds = string(advisorykey.Key(k).AppendToken(append(holds[:0], "lock "...)))
		id.Site = identity.SafeToken(site, "_")
		id.TraceID, id.SpanID = identity.TraceIDs(trace.SpanContextFromContext(ctx))
	}
	var buf [512]byte
	return string(append(append(id.AppendAnnotation(buf[:0]), text...), suffix...))
}

// SavepointRelease is the text that ends the savepoint of a lock
// statement on the connection's transaction-pooler holder
// (TxHolder.Run), annotated with the holder's identity: the oldest lock
// it holds, or else the one being taken (now, at the call site siteOf
// finds in ctx, in ctx's span); with Publishes it also sets the holder's
// application_name for its transaction.
func (c *Conn[K]) SavepointRelease(ctx context.Context, siteOf func(context.Context) string) string {
	const release = "RELEASE SAVEPOINT lockhooks_lock"
	c.Lock()
	id := c.IdentityLocked(nil)
	c.Unlock()
	if id == nil {
		id = new(identity.Holder)
		*id = c.Who.Base
		id.Holds, id.Site, id.Since = "lock", identity.SafeToken(siteOf(ctx), "_"), time.Now()
		id.TraceID, id.SpanID = identity.TraceIDs(trace.SpanContextFromContext(ctx))
	}
	q := id.Annotation() + release
	if c.Who.Publishes {
		q += "; SELECT " + identity.SetAppName(id.AppName(), true, 0)
	}
	return q
}

// OwnLocksQuery is the read of backend pid's advisory locks run on the
// connection after discards DISCARD ALLs (AfterDiscard). With annotate, on a connection that holds
// session locks, it begins with the holder's annotation: such a text
// changes with every hold (annotated is true: the caller keeps it out of
// the driver's statement cache), while the plain read (a connection that
// holds nothing) is composed once per pid and discard count and may be
// cached. A holder's text is composed in one buffer, so that the read
// costs an allocation or two, not one per field.
func (c *Conn[K]) OwnLocksQuery(pid, discards int32, annotate bool) (query string, annotated bool) {
	if annotate {
		var id identity.Holder
		c.Lock()
		holds := c.IdentityIntoLocked(&id, nil)
		c.Unlock()
		if holds {
			var buf [1024]byte
			b := id.AppendAnnotation(buf[:0])
			b = pgserver.AppendOwnLocksQuery(b, "(SELECT 1) one", pid, AfterDiscard(discards))
			return string(b), true
		}
	}
	c.Lock()
	defer c.Unlock()
	t := &c.plainRead
	if t.pid != pid || t.discards != discards || t.text == "" {
		*t = plainRead{pid: pid, discards: discards,
			text: string(pgserver.AppendOwnLocksQuery(nil, "(SELECT 1) one", pid, AfterDiscard(discards)))}
	}
	return t.text, false
}

// AfterDiscard returns a comment that makes lockhooks' own query texts new
// after each DISCARD ALL (n of them so far), so a driver that caches
// prepared statements by text (pgx) prepares them again instead of using
// ones the server forgot; "" before the first.
func AfterDiscard(n int32) string {
	if n > 0 {
		return " -- lockhooks: after DISCARD ALL " + strconv.Itoa(int(n))
	}
	return ""
}

// plainRead is a connection's read of pg_locks that does not change with
// what it holds (OwnLocksQuery), for one backend pid and DISCARD ALL
// count; guarded by State's mutex.
type plainRead struct {
	pid      int32
	discards int32
	text     string
}

package pgsession

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/identity"
)

// newIdentityConn returns a connection of database 3, pool "orders api"
// (made safe), number 7, that publishes.
func newIdentityConn() *Conn[namedKey] {
	c := new(Conn[namedKey])
	c.Who = NewIdentity(3, "orders api", 7)
	c.Who.Publishes = true
	return c
}

// The base names the process, the database and the connection, with the
// pool made safe for the encoding, and nothing it holds.
func TestNewIdentity(t *testing.T) {
	c := newIdentityConn()
	b := c.Who.Base
	if b.Process != identity.ProcessLabel() || b.Database != 3 || b.Pool != "orders_api" || b.Conn != 7 {
		t.Fatalf("base %+v: want this process, database 3, pool orders_api, connection 7", b)
	}
	if b.Holds != "" || b.Site != "" || !b.Since.IsZero() {
		t.Fatalf("base %+v holds something", b)
	}
}

// A holder names its oldest lock, leaving out the one being released;
// without another it names none.
func TestIdentityNamesTheOldestLock(t *testing.T) {
	c := newIdentityConn()
	old, young := namedKey{K1: 1}, namedKey{K1: 2}
	c.Lock()
	c.AddLocked(old, "a.go:1", noSpan, 1)
	c.Held[old].Since = time.Now().Add(-time.Hour)
	c.AddLocked(young, "b.go:2", noSpan, 1)
	id := c.IdentityLocked(nil)
	without := c.IdentityLocked(&old)
	c.Unlock()
	if id == nil || id.Site != "a.go:1" || !strings.HasSuffix(id.Holds, " 1") || id.Conn != 7 {
		t.Fatalf("identity %+v: want the lock of key 1 taken at a.go:1 by connection 7", id)
	}
	if without == nil || without.Site != "b.go:2" {
		t.Fatalf("identity without key 1 %+v: want the lock taken at b.go:2", without)
	}
	if c.Note(nil) != id.Annotation() {
		t.Fatalf("note %q, want the identity's annotation %q", c.Note(nil), id.Annotation())
	}
	c.Lock()
	c.ForgetLocked(old)
	c.ForgetLocked(young)
	c.Unlock()
	if c.Note(nil) != "" {
		t.Fatalf("a connection that holds nothing has the note %q", c.Note(nil))
	}
}

// A transaction's application_name names the connection and where the
// transaction began, and decodes back to them.
func TestTxAppName(t *testing.T) {
	c := newIdentityConn()
	id := identity.ParseAppName(c.TxAppName("svc/orders.go:42"))
	if id == nil || id.Holds != "tx" || id.Site != "svc/orders.go:42" || id.Conn != 7 || id.Pool != "orders_api" {
		t.Fatalf("decoded %+v: want a transaction of connection 7 begun at svc/orders.go:42", id)
	}
}

// A lock statement's text names the lock it takes when the connection
// holds nothing; an unlock of the last lock leaves the user's text; an
// unlock of one of two names the other.
func TestLockText(t *testing.T) {
	c := newIdentityConn()
	k, other := namedKey{K1: 5}, namedKey{K1: 6}
	text := "SELECT pg_advisory_lock(5)"
	got := c.LockText(context.Background(), false, k, "job.go:9", text, ", tok")
	if !strings.HasSuffix(got, text+", tok") {
		t.Fatalf("lock text %q does not end with the statement and its suffix", got)
	}
	if id := identity.ParseAnnotation(got); id == nil || id.Site != "job.go:9" || !strings.HasSuffix(id.Holds, " 5") || !id.Since.IsZero() {
		t.Fatalf("lock text %q names %+v: want key 5 taken at job.go:9, with no since", got, id)
	}
	c.Lock()
	c.AddLocked(k, "job.go:9", noSpan, 1)
	c.Unlock()
	if got := c.LockText(context.Background(), true, k, "job.go:10", "SELECT pg_advisory_unlock(5)", ""); got != "" {
		t.Fatalf("the unlock of the last lock has the text %q, want the user's (\"\")", got)
	}
	c.Lock()
	c.AddLocked(other, "job.go:11", noSpan, 1)
	c.Held[k].Since = time.Now().Add(-time.Hour)
	c.Unlock()
	got = c.LockText(context.Background(), true, k, "job.go:12", "SELECT pg_advisory_unlock(5)", "")
	if id := identity.ParseAnnotation(got); id == nil || id.Site != "job.go:11" {
		t.Fatalf("the unlock of one of two names %+v, want the other lock (job.go:11)", id)
	}
}

// The plain read is composed once per pid and DISCARD ALL count (the
// same text each time, a new one after DISCARD ALL); a holder's read is
// annotated, and only with annotate.
func TestOwnLocksQuery(t *testing.T) {
	c := newIdentityConn()
	q1, annotated := c.OwnLocksQuery(100, 0, true)
	if annotated || strings.Contains(q1, "DISCARD") {
		t.Fatalf("a connection that holds nothing: annotated %v, query %q", annotated, q1)
	}
	if q2, _ := c.OwnLocksQuery(100, 0, true); q2 != q1 {
		t.Fatalf("the plain read changed: %q, then %q", q1, q2)
	}
	q3, _ := c.OwnLocksQuery(100, 2, true)
	if q3 == q1 || !strings.HasSuffix(q3, AfterDiscard(2)) {
		t.Fatalf("after two DISCARD ALLs the read is %q, want it to end with %q", q3, AfterDiscard(2))
	}
	c.Lock()
	c.AddLocked(namedKey{K1: 9}, "w.go:1", noSpan, 1)
	c.Unlock()
	q4, annotated := c.OwnLocksQuery(100, 2, true)
	if !annotated || identity.ParseAnnotation(q4) == nil {
		t.Fatalf("a holder's read %q (annotated %v) does not name it", q4, annotated)
	}
	if q5, annotated := c.OwnLocksQuery(100, 2, false); annotated || q5 != q3 {
		t.Fatalf("without annotate a holder's read is %q (annotated %v), want the plain %q", q5, annotated, q3)
	}
}

// The savepoint's release names the lock being taken when nothing is
// held, and sets the transaction's application_name only where the
// connection publishes.
func TestSavepointRelease(t *testing.T) {
	c := newIdentityConn()
	site := func(context.Context) string { return "lead.go:3" }
	q := c.SavepointRelease(context.Background(), site)
	if !strings.Contains(q, "RELEASE SAVEPOINT lockhooks_lock; SELECT set_config('application_name'") {
		t.Fatalf("release %q does not set the transaction's application_name", q)
	}
	if id := identity.ParseAnnotation(q); id == nil || id.Holds != "lock" || id.Site != "lead.go:3" {
		t.Fatalf("release %q names %+v, want the lock being taken at lead.go:3", q, id)
	}
	c.Who.Publishes = false
	if q := c.SavepointRelease(context.Background(), site); strings.Contains(q, "set_config") {
		t.Fatalf("a connection that does not publish sets application_name: %q", q)
	}
}

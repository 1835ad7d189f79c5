package stmtlocks

import (
	"fmt"
	"slices"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/lockorder"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// kind is the kind of a tracked lock.
type kind uint8

const (
	row              kind = iota // rows of a table (FOR [NO KEY] UPDATE; UPDATE and DELETE with the checker on)
	advisory                     // an advisory key
	locksetNamespace             // a Lock namespace
)

// Lock is one lock a transaction (or, for session advisory locks, a
// connection) took, as far as lockhooks can see it. Names are resolved
// lazily from the statement text so that tracking allocates nothing on
// the path every locking statement takes; order and count are filled
// only when the checker is on.
type Lock struct {
	kind kind
	text string          // row: the statement as written
	mode string          // row: FOR UPDATE, FOR NO KEY UPDATE, UPDATE, DELETE
	key  advisorykey.Key // advisory, when keyOK
	expr string          // advisory: the key expression, when !keyOK
	name string          // locksetNamespace: the namespace
	ids  []string        // locksetNamespace: canonical ids, sorted

	keyOK bool

	// Lock-order checker only.
	order lockorder.Lock // the lock as the checker sees it
	count int            // session locks: holds of the class (they stack)
}

// Order returns the lock as the lock-order checker sees it.
func (l *Lock) Order() *lockorder.Lock { return &l.order }

// Describe names the lock for messages; names names a bigint advisory key
// by what it was made from, where known.
func (l *Lock) Describe(names func(int64) string) string {
	switch l.kind {
	case locksetNamespace:
		return fmt.Sprintf("lockset %q ids %s", l.name, lockset.DescribeIDs(l.ids))
	case advisory:
		if l.keyOK {
			return "advisory key " + l.key.Describe(names)
		}
		return "advisory key " + l.expr
	}
	table := sqlscan.LockTarget(l.text, sqlscan.Postgres).Table
	if table == "" {
		table = "a table"
	}
	return "rows of " + table + " (" + l.mode + ")"
}

// advisoryClass is the lock class of an advisory key.
func (l *Lock) advisoryClass(names func(int64) string) string {
	if l.keyOK {
		return "advisory key " + l.key.Exclusive().Describe(names) // shared and exclusive holds of a key are one class
	}
	return "advisory key " + l.expr
}

// Tx is a transaction's tracked locks: those taken before the statement
// running now, and those it asks for. The zero value is empty.
type Tx struct {
	list []Lock
	mark int // list[:mark] were taken before the statement running now
}

// Reset forgets everything, keeping the memory for the connection's next
// transaction.
func (t *Tx) Reset() {
	clear(t.list)
	t.list, t.mark = t.list[:0], 0
}

// Mark starts a statement: what the transaction asked for so far is held.
func (t *Tx) Mark() { t.mark = len(t.list) }

// Describe names the locks held before the current statement and those
// the current statement asked for.
func (t *Tx) Describe(names func(int64) string) (held, waiting []string) {
	for i := range t.list {
		d := t.list[i].Describe(names)
		if i < t.mark {
			held = append(held, d)
		} else {
			waiting = append(waiting, d)
		}
	}
	return held, waiting
}

// Session is a connection's state for the lock-order checker: the session
// advisory locks it holds, which order what it takes next in any of its
// transactions. The zero value is empty.
type Session struct {
	list []Lock
}

// Describe names the session locks, known only with the checker on.
func (s *Session) Describe(names func(int64) string) []string {
	var out []string
	for i := range s.list {
		out = append(out, s.list[i].Describe(names)+" (session)")
	}
	return out
}

// clear forgets every session lock (pg_advisory_unlock_all, DISCARD ALL).
func (s *Session) clear() { s.list = s.list[:0] }

// unlock drops one hold of a session lock class.
func (s *Session) unlock(class string) {
	for i := range s.list {
		if s.list[i].order.Class == class {
			if s.list[i].count--; s.list[i].count <= 0 {
				s.list = slices.Delete(s.list, i, i+1)
			}
			return
		}
	}
}

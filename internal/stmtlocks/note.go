package stmtlocks

import (
	"database/sql/driver"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/lockorder"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Checker is the lock-order checker: the order graph of every database
// opened with one option, and how its classes name advisory keys. It is
// safe for concurrent use.
type Checker struct {
	graph *lockorder.Graph[Lock, *Lock]
	names func(int64) string
}

// NewChecker returns a checker with an empty graph; names names a bigint
// advisory key in a class by what it was made from, where known.
func NewChecker(names func(int64) string) *Checker {
	return &Checker{graph: lockorder.New[Lock](lockset.DescribeID), names: names}
}

// Unordered reports rows locks rows of class were locked at site without
// ORDER BY (once per site; false when already reported or rows < 2).
func (c *Checker) Unordered(class string, site *callsite.Trail, rows int) (lockorder.Report, bool) {
	return c.graph.Unordered(class, site, rows)
}

// A Reporter is handed what the checker found, as it finds it, on the
// goroutine of the statement that found it.
type Reporter interface {
	LockOrder(found []lockorder.Report)
}

// Statement is what [Note] needs of one statement: its text as the
// application wrote it and its bound arguments, its advisory calls (nil
// when none), the row-locking clauses in its text, whether FOR UPDATE was
// rewritten to FOR NO KEY UPDATE, and the engine's dialect.
type Statement struct {
	Text     string
	Args     []driver.NamedValue
	Advisory *sqlscan.Advisory
	Locks    sqlscan.LockInfo
	Rewrote  bool
	Dialect  sqlscan.Dialect
}

// Note records the locks a statement is about to ask for: into its
// transaction's list tx (for DeadlockError; nil outside a transaction),
// and, with the checker ch on (nil: off), into the order graph, with the
// connection's session locks s; reports go to r as they are found. Called
// before the statement runs, because a statement that deadlocks still
// tells the order it asked in.
func Note(st Statement, tx *Tx, s *Session, ch *Checker, r Reporter) {
	if adv := st.Advisory; adv != nil {
		if adv.DiscardAll && ch != nil {
			s.clear()
		}
		for _, call := range adv.Calls {
			f := call.Func
			switch {
			case f&sqlscan.FnUnlockAll != 0:
				if ch != nil {
					s.clear()
				}
				continue
			case f&sqlscan.FnTry != 0:
				continue // a try-lock never waits, so it orders nothing
			}
			l := Lock{kind: advisory}
			l.key, l.keyOK = KeyOf(call, st.Args)
			if !l.keyOK {
				l.expr = call.Args[0].Text
			}
			switch {
			case f&sqlscan.FnUnlock != 0:
				if ch != nil {
					s.unlock(l.advisoryClass(ch.names))
				}
			case f&sqlscan.FnXact != 0:
				if tx != nil {
					take(l, tx, s, ch, r)
				}
			case ch != nil:
				takeSession(l, tx, s, ch, r)
			}
		}
	}
	if tx == nil {
		return
	}
	query := st.Text
	var l Lock
	switch {
	case st.Locks&(sqlscan.ForUpdate|sqlscan.ForNoKeyUpdate) != 0:
		l = Lock{kind: row, text: query, mode: "FOR UPDATE"}
		if st.Rewrote || st.Locks&sqlscan.ForNoKeyUpdate != 0 && st.Locks&sqlscan.ForUpdate == 0 {
			l.mode = "FOR NO KEY UPDATE"
		}
	case ch != nil:
		switch w := sqlscan.FirstWord(query); {
		case strings.EqualFold(w, "UPDATE"), strings.EqualFold(w, "DELETE"):
			l = Lock{kind: row, text: query, mode: strings.ToUpper(w)}
		default:
			return
		}
	default:
		return
	}
	if ch != nil {
		tg := sqlscan.LockTarget(query, st.Dialect)
		if tg.Table != "" { // else an unknown table: no class, only the record
			l.order.Class = "table " + strings.ToLower(tg.Table)
		}
		if tg.Table != "" && tg.HasKey {
			v, ok := tg.Literal, true
			if tg.Param > 0 {
				v, ok = ArgInt(st.Args, tg.Param)
			}
			if ok {
				l.order.Column = strings.ToLower(tg.Column)
				l.order.Lo = lockset.IntID(v)
				l.order.Hi = l.order.Lo
			}
		}
	}
	take(l, tx, s, ch, r)
}

// NoteLockset records a lockset request of transaction tx that was
// granted: the namespace and its canonical ids, sorted (at least one).
func NoteLockset(namespace string, ids []string, tx *Tx, s *Session, ch *Checker, r Reporter) {
	l := Lock{kind: locksetNamespace, name: namespace, ids: ids}
	if ch != nil {
		l.order.Class = "lockset " + strconv.Quote(namespace)
		l.order.Lo, l.order.Hi = ids[0], ids[len(ids)-1]
	}
	take(l, tx, s, ch, r)
	tx.Mark() // granted: held, not waited for
}

// take records a lock of transaction tx and, with the checker on, the
// order it was taken in.
func take(l Lock, tx *Tx, s *Session, ch *Checker, r Reporter) {
	tx.list = append(tx.list, l) // l itself must not escape: this runs for every tracked lock
	if ch == nil {
		return
	}
	n := len(tx.list) - 1
	p := &tx.list[n]
	if p.kind == advisory {
		p.order.Class = p.advisoryClass(ch.names)
	}
	if p.order.Class == "" {
		return
	}
	site := new(callsite.Trail)
	site.Capture()
	p.order.Site = site
	report(r, ch.graph.Taken(&p.order, s.list, tx.list[:n]))
}

// takeSession records a session advisory lock for the checker; tx is the
// connection's transaction (nil outside one).
func takeSession(l Lock, tx *Tx, s *Session, ch *Checker, r Reporter) {
	l.order.Class = l.advisoryClass(ch.names)
	for i := range s.list {
		if s.list[i].order.Class == l.order.Class {
			s.list[i].count++
			return
		}
	}
	site := new(callsite.Trail)
	site.Capture()
	l.order.Site = site
	l.count = 1
	var held []Lock
	if tx != nil {
		held = tx.list
	}
	report(r, ch.graph.Taken(&l.order, s.list, held))
	s.list = append(s.list, l)
}

// report hands found to r, if anything was found.
func report(r Reporter, found []lockorder.Report) {
	if len(found) > 0 {
		r.LockOrder(found)
	}
}

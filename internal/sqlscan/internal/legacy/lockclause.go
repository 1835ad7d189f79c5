package legacy

import "strings"

// LockInfo says which row-locking clauses a text has; bits can combine.
type LockInfo uint16

// LockInfo bits.
const (
	ForUpdate      LockInfo = 1 << iota // FOR UPDATE, as written (before any rewrite)
	ForNoKeyUpdate                      // FOR NO KEY UPDATE, as written
	ForShare                            // FOR SHARE
	ForKeyShare                         // FOR KEY SHARE
	NoWait                              // a clause has NOWAIT
	SkipLocked                          // a clause has SKIP LOCKED
	Kept                                // a FOR UPDATE was left alone because of KeepComment
)

// Locks reports whether info has any row-locking clause.
func (info LockInfo) Locks() bool {
	return info&(ForUpdate|ForNoKeyUpdate|ForShare|ForKeyShare) != 0
}

// KeepComment in a statement stops RewriteForUpdate from changing it.
const KeepComment = "lockhooks:keep-for-update"

// Op is what Rewrite does with the locking clauses it finds.
type Op uint8

// Operations.
const (
	Inspect     Op = iota // change nothing, only report
	NoKeyUpdate           // FOR UPDATE -> FOR NO KEY UPDATE
	Strip                 // remove every locking clause (for SQLite)
)

// MayLock reports whether src contains the letters "for" in any case: text
// without them has no locking clause. It is much cheaper than scanning.
func MayLock(src string) bool {
	return hasFor(src, 'f') || hasFor(src, 'F')
}

// hasFor reports whether s has f (either case of "f") followed by "or" in
// any case.
func hasFor(s string, f byte) bool {
	for {
		i := strings.IndexByte(s, f)
		if i < 0 || i+2 >= len(s) {
			return false
		}
		if s[i+1]|0x20 == 'o' && s[i+2]|0x20 == 'r' {
			return true
		}
		s = s[i+1:]
	}
}

// Rewrite finds the row-locking clauses of the query statements in src
// (SELECT at any nesting, CTEs, UNION arms, DECLARE … CURSOR FOR SELECT,
// EXPLAIN, INSERT … SELECT and the like; never DDL such as CREATE POLICY …
// FOR UPDATE, never inside literals, quoted identifiers or comments) and
// applies op to them. Everything outside the changed clauses stays byte for
// byte. It returns src itself, with no allocation, when nothing changes.
func Rewrite(src string, d Dialect, op Op) (string, LockInfo) {
	if !MayLock(src) {
		return src, 0
	}
	w := walker{s: New(src, d), op: op}
	w.walk()
	if w.nEdits == 0 {
		return src, w.info
	}
	return w.apply(src), w.info
}

// edit is one change: insert "NO KEY " at pos, or delete src[pos:end].
type edit struct{ pos, end int }

// maxDepth is how many nested parentheses the walker tells apart; deeper
// levels are treated as not holding a query (no change there).
const maxDepth = 64

// walker walks the tokens of a text, one statement at a time.
type walker struct {
	s    Scanner
	op   Op
	info LockInfo
	// The edits: the first ones in a fixed array (walker does not escape,
	// so this costs no allocation), more in a slice.
	few    [4]edit
	more   []edit
	nEdits int

	// per statement
	stmtEdits  int    // nEdits when the statement began
	first      bool   // the next significant token is the statement's first
	rewritable bool   // the statement is DML (query context at level 0)
	create     bool   // the statement is CREATE … (may have a BEGIN … END body)
	keep       bool   // the statement carries KeepComment
	depth      int    // parenthesis depth
	body       int    // BEGIN [ATOMIC] … END nesting inside a CREATE
	query      uint64 // bit i: level i+1 is a parenthesised query
	levelOpen  bool   // a '(' was just opened; its first token decides
	keptUpdate bool   // the statement has a FOR UPDATE that keep protects
}

func (w *walker) walk() {
	w.startStatement()
	for {
		t := w.next()
		switch t.Kind {
		case EOF:
			w.endStatement()
			return
		case Punct:
			w.punct(w.s.src[t.Start], t)
		case Word:
			w.word(t)
		default:
			w.other()
		}
	}
}

// next returns the next token that is not space; comments are checked for
// KeepComment and skipped.
func (w *walker) next() Token {
	for {
		w.s.SkipSpace()
		t := w.s.Next()
		switch t.Kind {
		case Space:
			continue
		case Comment:
			if strings.Contains(w.s.Text(t), KeepComment) {
				w.keep = true
			}
			continue
		}
		return t
	}
}

// addEdit records one change.
func (w *walker) addEdit(e edit) {
	if w.nEdits < len(w.few) {
		w.few[w.nEdits] = e
	} else {
		w.more = append(w.more, e)
	}
	w.nEdits++
}

// edit returns the i-th change.
func (w *walker) edit(i int) edit {
	if i < len(w.few) {
		return w.few[i]
	}
	return w.more[i-len(w.few)]
}

func (w *walker) startStatement() {
	w.stmtEdits = w.nEdits
	w.first = true
	w.rewritable, w.create, w.keep, w.keptUpdate = false, false, false, false
	w.depth, w.body, w.query, w.levelOpen = 0, 0, 0, false
}

// endStatement drops the statement's edits if it carries KeepComment.
func (w *walker) endStatement() {
	if w.keep && w.op == NoKeyUpdate {
		if w.keptUpdate {
			w.info |= Kept
		}
		w.nEdits = w.stmtEdits
		if w.nEdits > len(w.few) {
			w.more = w.more[:w.nEdits-len(w.few)]
		} else {
			w.more = w.more[:0]
		}
	}
}

func (w *walker) punct(c byte, t Token) {
	if w.first {
		w.first = false
		w.rewritable = c == '('
	}
	switch c {
	case '(':
		if w.levelOpen {
			w.setQuery(true) // "((": the outer level is a parenthesised query
		}
		w.depth++
		w.levelOpen = true
		return
	case ')':
		if w.levelOpen {
			w.setQuery(false)
		}
		if w.depth > 0 {
			w.depth--
		}
	case ';':
		if w.levelOpen {
			w.setQuery(false)
		}
		if w.depth == 0 && w.body == 0 {
			w.endStatement()
			w.startStatement()
			return
		}
	default:
		if w.levelOpen {
			w.setQuery(false)
		}
	}
	w.levelOpen = false
}

func (w *walker) other() {
	if w.first {
		w.first = false
	}
	if w.levelOpen {
		w.setQuery(false)
		w.levelOpen = false
	}
}

func (w *walker) word(t Token) {
	text := w.s.Text(t)
	if w.first {
		w.first = false
		w.rewritable = isQueryStatement(text)
		w.create = strings.EqualFold(text, "CREATE")
	}
	if w.levelOpen {
		w.setQuery(isQueryStart(text))
		w.levelOpen = false
	}
	if !w.rewritable {
		w.trackBody(text)
		return
	}
	if len(text) == 3 && strings.EqualFold(text, "FOR") && w.inQuery() {
		w.lockingClause(t)
	}
}

// trackBody follows BEGIN ATOMIC … END (SQLite: BEGIN … END) bodies of a
// CREATE statement, whose semicolons do not end the statement.
func (w *walker) trackBody(text string) {
	if !w.create {
		return
	}
	switch {
	case strings.EqualFold(text, "BEGIN"):
		if w.body > 0 || w.s.dialect == SQLite || w.peekWord("ATOMIC") {
			w.body++
		}
	case w.body > 0 && strings.EqualFold(text, "CASE"):
		w.body++
	case w.body > 0 && strings.EqualFold(text, "END"):
		w.body--
	}
}

// peekWord reports whether the next significant token is the word want,
// without consuming it.
func (w *walker) peekWord(want string) bool {
	save := w.s
	keep := w.keep
	t := w.next()
	w.s, w.keep = save, keep
	return t.Kind == Word && strings.EqualFold(w.s.Text(t), want)
}

// lockingClause reads what follows FOR; if it is a locking strength, it
// records the clause and applies the operation.
func (w *walker) lockingClause(forTok Token) {
	save := w.s
	var strength LockInfo
	var updateAt int
	t := w.next()
	switch {
	case w.isWord(t, "UPDATE"):
		strength, updateAt = ForUpdate, t.Start
	case w.isWord(t, "SHARE"):
		strength = ForShare
	case w.isWord(t, "NO"):
		if t = w.next(); w.isWord(t, "KEY") {
			if t = w.next(); w.isWord(t, "UPDATE") {
				strength = ForNoKeyUpdate
			}
		}
	case w.isWord(t, "KEY"):
		if t = w.next(); w.isWord(t, "SHARE") {
			strength = ForKeyShare
		}
	}
	if strength == 0 {
		w.s = save // FOR something else: DECLARE … FOR SELECT, substring(… FOR n)
		return
	}
	w.info |= strength
	end := t.End
	// [OF name [, name …]] [NOWAIT | SKIP LOCKED]
	save = w.s
	t = w.next()
	if w.isWord(t, "OF") {
		for {
			if t = w.next(); t.Kind != Word && t.Kind != QuotedIdent {
				break
			}
			end = t.End
			save = w.s
			t = w.next()
			if t.Kind == Punct && (w.s.src[t.Start] == '.' || w.s.src[t.Start] == ',') {
				continue
			}
			break
		}
	}
	switch {
	case w.isWord(t, "NOWAIT"):
		w.info |= NoWait
		end, save = t.End, w.s
	case w.isWord(t, "SKIP"):
		if t2 := w.next(); w.isWord(t2, "LOCKED") {
			w.info |= SkipLocked
			end, save = t2.End, w.s
		}
	}
	w.s = save

	switch w.op {
	case NoKeyUpdate:
		if strength == ForUpdate {
			w.keptUpdate = true
			w.addEdit(edit{pos: updateAt, end: updateAt})
		}
	case Strip:
		w.addEdit(edit{pos: forTok.Start, end: end})
	}
}

func (w *walker) isWord(t Token, want string) bool {
	return t.Kind == Word && t.End-t.Start == len(want) && strings.EqualFold(w.s.Text(t), want)
}

// setQuery records whether the innermost open level holds a query.
func (w *walker) setQuery(q bool) {
	if w.depth == 0 || w.depth > maxDepth {
		return
	}
	bit := uint64(1) << (w.depth - 1)
	if q {
		w.query |= bit
	} else {
		w.query &^= bit
	}
}

// inQuery reports whether the current level is a query context.
func (w *walker) inQuery() bool {
	if w.depth == 0 {
		return true // the statement is rewritable
	}
	return w.depth <= maxDepth && w.query&(1<<(w.depth-1)) != 0
}

// apply returns src with the edits made.
func (w *walker) apply(src string) string {
	var b strings.Builder
	b.Grow(len(src) + len("NO KEY ")*w.nEdits)
	last := 0
	for i := range w.nEdits {
		e := w.edit(i)
		b.WriteString(src[last:e.pos])
		if e.end == e.pos {
			b.WriteString("NO KEY ")
		}
		last = e.end
	}
	b.WriteString(src[last:])
	return b.String()
}

// isQueryStatement reports whether a statement starting with word may hold
// a SELECT's locking clause (DML, not DDL).
func isQueryStatement(word string) bool {
	for _, k := range [...]string{"SELECT", "WITH", "VALUES", "TABLE", "DECLARE", "EXPLAIN", "PREPARE",
		"INSERT", "UPDATE", "DELETE", "MERGE", "COPY"} {
		if strings.EqualFold(word, k) {
			return true
		}
	}
	return false
}

// isQueryStart reports whether a parenthesised level starting with word is
// a query.
func isQueryStart(word string) bool {
	for _, k := range [...]string{"SELECT", "WITH", "VALUES", "TABLE"} {
		if strings.EqualFold(word, k) {
			return true
		}
	}
	return false
}

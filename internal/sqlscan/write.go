package sqlscan

import "strings"

// writeVerbs start statements that write (or change the schema).
var writeVerbs = [...]string{"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "VACUUM", "REINDEX", "UPSERT"}

// dmlVerbs make a WITH statement a write, as its main statement or as the
// body of one of its common table expressions (Postgres allows DML there).
var dmlVerbs = [...]string{"INSERT", "UPDATE", "DELETE", "REPLACE"}

// IsWrite reports whether the statement text src (SQLite) writes. It reads
// the structure, not keywords anywhere: a statement writes when its verb
// is INSERT, UPDATE, DELETE, REPLACE, CREATE, DROP, ALTER, VACUUM or
// REINDEX, or it is a WITH … whose main statement or one of whose common
// table expression bodies begins with a DML verb. So a replace() call or an
// identifier named like a verb makes no write. Every statement of a
// multi-statement text counts. A WITH whose structure it cannot follow
// counts as a write (taking the writer lock is the safe mistake). It
// allocates nothing.
func IsWrite(src string) bool { return isWrite(newCursor(src, SQLite)) }

// isWrite is IsWrite on the text at c, read from its start.
func isWrite(c cursor) bool {
	src := c.src()
	for {
		t := c.nextSignificant()
		switch {
		case t.Kind == EOF:
			return false
		case t.Kind == Punct && src[t.Start] == ';':
			continue
		case t.Kind == Word:
			w := c.text(t)
			if isVerb(w, writeVerbs[:]) {
				return true
			}
			if strings.EqualFold(w, "WITH") && withWrites(&c) {
				return true
			}
		}
		// A text without another ';' holds no further statement: most
		// statements end here, without being lexed to their end.
		if strings.IndexByte(src[c.pos():], ';') < 0 || !skipStatement(&c) {
			return false
		}
	}
}

// isVerb reports whether w is one of verbs, case-insensitively.
func isVerb(w string, verbs []string) bool {
	for _, v := range verbs {
		if len(w) == len(v) && strings.EqualFold(w, v) {
			return true
		}
	}
	return false
}

// isWord reports whether t is the keyword w.
func isWord(c *cursor, t Token, w string) bool {
	return t.Kind == Word && strings.EqualFold(c.text(t), w)
}

// withWrites reads a WITH clause after the WITH keyword:
//
//	[RECURSIVE] name [(columns)] AS [[NOT] MATERIALIZED] (body) [, …] main
//
// and reports whether a body or the main statement begins with a DML
// verb. It stops after the main statement's first word.
func withWrites(c *cursor) bool {
	t := c.nextSignificant()
	if isWord(c, t, "RECURSIVE") {
		t = c.nextSignificant()
	}
	for {
		if t.Kind != Word && t.Kind != QuotedIdent && t.Kind != String {
			return true // not a CTE name
		}
		t = c.nextSignificant()
		if c.at(t, '(') {
			if !skipTo(c, 1) {
				return true
			}
			t = c.nextSignificant()
		}
		if !isWord(c, t, "AS") {
			return true
		}
		t = c.nextSignificant()
		if isWord(c, t, "NOT") {
			t = c.nextSignificant()
		}
		if isWord(c, t, "MATERIALIZED") {
			t = c.nextSignificant()
		}
		if !c.at(t, '(') {
			return true
		}
		// The body: its first word is its verb.
		depth := 1
		t = c.nextSignificant()
		for c.at(t, '(') {
			depth++
			t = c.nextSignificant()
		}
		if t.Kind == Word {
			w := c.text(t)
			if isVerb(w, dmlVerbs[:]) {
				return true
			}
			if strings.EqualFold(w, "WITH") && withWrites(c) {
				return true
			}
		} else if c.at(t, ')') {
			depth--
		}
		if !skipTo(c, depth) {
			return true
		}
		// After the body: another CTE, or the main statement.
		t = c.nextSignificant()
		if c.at(t, ',') {
			t = c.nextSignificant()
			continue
		}
		if t.Kind != Word {
			return true
		}
		return isVerb(c.text(t), dmlVerbs[:])
	}
}

// skipTo reads tokens until depth open parentheses are closed; it reports
// false at the end of the text.
func skipTo(c *cursor, depth int) bool {
	for depth > 0 {
		t := c.next()
		switch {
		case t.Kind == EOF:
			return false
		case c.at(t, '('):
			depth++
		case c.at(t, ')'):
			depth--
		}
	}
	return true
}

// skipStatement reads up to and including the ';' that ends the current
// statement; it reports false at the end of the text. A ';' inside
// parentheses or a CREATE TRIGGER body does not end it: the trigger's
// CREATE has made the text a write before this is reached.
func skipStatement(c *cursor) bool {
	depth := 0
	for {
		t := c.next()
		switch {
		case t.Kind == EOF:
			return false
		case c.at(t, '('):
			depth++
		case c.at(t, ')'):
			if depth > 0 {
				depth--
			}
		case c.at(t, ';') && depth == 0:
			return true
		}
	}
}

package legacy

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
func IsWrite(src string) bool {
	s := New(src, SQLite)
	for {
		t := nextSignificant(&s)
		switch {
		case t.Kind == EOF:
			return false
		case t.Kind == Punct && src[t.Start] == ';':
			continue
		case t.Kind == Word:
			w := s.Text(t)
			if isVerb(w, writeVerbs[:]) {
				return true
			}
			if strings.EqualFold(w, "WITH") && withWrites(&s) {
				return true
			}
		}
		// A text without another ';' holds no further statement: most
		// statements end here, without being lexed to their end.
		if strings.IndexByte(src[s.Pos():], ';') < 0 || !skipStatement(&s) {
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

// isPunct reports whether t is the single byte c.
func isPunct(s *Scanner, t Token, c byte) bool {
	return t.Kind == Punct && s.src[t.Start] == c
}

// isWord reports whether t is the keyword w.
func isWord(s *Scanner, t Token, w string) bool {
	return t.Kind == Word && strings.EqualFold(s.Text(t), w)
}

// withWrites reads a WITH clause after the WITH keyword:
//
//	[RECURSIVE] name [(columns)] AS [[NOT] MATERIALIZED] (body) [, …] main
//
// and reports whether a body or the main statement begins with a DML
// verb. It stops after the main statement's first word.
func withWrites(s *Scanner) bool {
	t := nextSignificant(s)
	if isWord(s, t, "RECURSIVE") {
		t = nextSignificant(s)
	}
	for {
		if t.Kind != Word && t.Kind != QuotedIdent && t.Kind != String {
			return true // not a CTE name
		}
		t = nextSignificant(s)
		if isPunct(s, t, '(') {
			if !skipTo(s, 1) {
				return true
			}
			t = nextSignificant(s)
		}
		if !isWord(s, t, "AS") {
			return true
		}
		t = nextSignificant(s)
		if isWord(s, t, "NOT") {
			t = nextSignificant(s)
		}
		if isWord(s, t, "MATERIALIZED") {
			t = nextSignificant(s)
		}
		if !isPunct(s, t, '(') {
			return true
		}
		// The body: its first word is its verb.
		depth := 1
		t = nextSignificant(s)
		for isPunct(s, t, '(') {
			depth++
			t = nextSignificant(s)
		}
		if t.Kind == Word {
			w := s.Text(t)
			if isVerb(w, dmlVerbs[:]) {
				return true
			}
			if strings.EqualFold(w, "WITH") && withWrites(s) {
				return true
			}
		} else if isPunct(s, t, ')') {
			depth--
		}
		if !skipTo(s, depth) {
			return true
		}
		// After the body: another CTE, or the main statement.
		t = nextSignificant(s)
		if isPunct(s, t, ',') {
			t = nextSignificant(s)
			continue
		}
		if t.Kind != Word {
			return true
		}
		return isVerb(s.Text(t), dmlVerbs[:])
	}
}

// skipTo reads tokens until depth open parentheses are closed; it reports
// false at the end of the text.
func skipTo(s *Scanner, depth int) bool {
	for depth > 0 {
		t := s.Next()
		switch {
		case t.Kind == EOF:
			return false
		case isPunct(s, t, '('):
			depth++
		case isPunct(s, t, ')'):
			depth--
		}
	}
	return true
}

// skipStatement reads up to and including the ';' that ends the current
// statement; it reports false at the end of the text. A ';' inside
// parentheses or a CREATE TRIGGER body does not end it: the trigger's
// CREATE has made the text a write before this is reached.
func skipStatement(s *Scanner) bool {
	depth := 0
	for {
		t := s.Next()
		switch {
		case t.Kind == EOF:
			return false
		case isPunct(s, t, '('):
			depth++
		case isPunct(s, t, ')'):
			if depth > 0 {
				depth--
			}
		case isPunct(s, t, ';') && depth == 0:
			return true
		}
	}
}

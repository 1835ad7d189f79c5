package legacy

import (
	"strconv"
	"strings"
)

// Target is what a row-locking statement locks, as far as its text says:
// the table whose rows it locks and, when the WHERE clause starts with
// "column = value", that column and value. It serves the lock-order
// checker, which must not be wrong about order but may miss a statement.
type Target struct {
	Table string // the table's name as written (qualified if it was), "" if unknown
	Verb  string // SELECT, UPDATE or DELETE, upper case

	// Column = a key: the first predicate of the outermost WHERE, when it
	// is "column = $n" / "?" or "column = integer".
	Column  string
	Param   int   // the bind parameter's 1-based number, 0 if a literal
	Literal int64 // the literal's value when Param is 0
	HasKey  bool

	OrderBy bool // the outermost query has ORDER BY
}

// LockTarget reads the target of an UPDATE, a DELETE or a SELECT (the
// first table after its outermost FROM). WITH statements and anything else
// give a zero Target.
func LockTarget(src string, d Dialect) Target {
	s := New(src, d)
	t := nextSignificant(&s)
	if t.Kind != Word {
		return Target{}
	}
	var tg Target
	switch w := strings.ToUpper(s.Text(t)); w {
	case "UPDATE":
		tg.Verb = w
		tg.Table = tableName(&s)
	case "DELETE":
		tg.Verb = w
		if f := nextSignificant(&s); f.Kind != Word || !strings.EqualFold(s.Text(f), "FROM") {
			return Target{}
		}
		tg.Table = tableName(&s)
	case "SELECT":
		tg.Verb = w
	default:
		return Target{}
	}
	depth, params := 0, 0
	afterWhere := -1 // tokens seen since the outermost WHERE
	var col string
	for {
		t := nextSignificant(&s)
		if t.Kind == EOF {
			return tg
		}
		if t.Kind == Param && s.Text(t) == "?" {
			params++
		}
		switch {
		case t.Kind == Punct && s.src[t.Start] == '(':
			depth++
		case t.Kind == Punct && s.src[t.Start] == ')':
			depth--
		case depth != 0:
		case t.Kind == Word && strings.EqualFold(s.Text(t), "FROM") && tg.Table == "" && tg.Verb == "SELECT":
			save := s
			if tg.Table = tableName(&s); tg.Table == "" {
				s = save // a subquery: its FROM is not the outer one
			}
			continue
		case t.Kind == Word && strings.EqualFold(s.Text(t), "WHERE"):
			afterWhere = 0
			continue
		case t.Kind == Word && strings.EqualFold(s.Text(t), "ORDER"):
			if b := nextSignificant(&s); b.Kind == Word && strings.EqualFold(s.Text(b), "BY") {
				tg.OrderBy = true
			}
			afterWhere = -1
			continue
		}
		if afterWhere < 0 || depth != 0 {
			continue
		}
		switch afterWhere {
		case 0: // the column, possibly qualified
			if t.Kind != Word && t.Kind != QuotedIdent {
				afterWhere = -1
				continue
			}
			col = s.Text(t)
			for {
				save := s
				if dot := nextSignificant(&s); dot.Kind != Punct || s.src[dot.Start] != '.' {
					s = save
					break
				}
				c := nextSignificant(&s)
				if c.Kind != Word && c.Kind != QuotedIdent {
					return tg
				}
				col = s.Text(c)
			}
		case 1: // a lone '='
			if t.Kind != Punct || s.src[t.Start] != '=' || t.End < len(s.src) && s.src[t.End] == '=' {
				afterWhere = -1
				continue
			}
		case 2: // the key
			switch t.Kind {
			case Param:
				if n := paramNumber(s.Text(t), params); n > 0 {
					tg.Column, tg.Param, tg.HasKey = col, n, true
				}
			case Number:
				if v, err := strconv.ParseInt(s.Text(t), 10, 64); err == nil {
					tg.Column, tg.Literal, tg.HasKey = col, v, true
				}
			}
			if !tg.HasKey {
				afterWhere = -1
				continue
			}
		case 3:
			// "col = x AND …" keeps the key; "col = x OR …" or "col = x + 1" does not.
			end := t.Kind == Punct && s.src[t.Start] == ';' ||
				t.Kind == Word && (strings.EqualFold(s.Text(t), "AND") || isClauseEnd(s.Text(t)))
			if !end {
				tg.HasKey, tg.Column, tg.Param, tg.Literal = false, "", 0, 0
			}
			afterWhere = -1
			continue
		}
		afterWhere++
	}
}

// isClauseEnd reports whether word ends a WHERE clause.
func isClauseEnd(word string) bool {
	for _, k := range [...]string{"RETURNING", "FOR", "ORDER", "LIMIT", "GROUP", "OFFSET", "FETCH"} {
		if strings.EqualFold(word, k) {
			return true
		}
	}
	return false
}

// paramNumber returns the 1-based number of a positional parameter: $n,
// ?n, or the count of bare ? so far; 0 for named parameters.
func paramNumber(p string, bare int) int {
	if p == "?" {
		return bare
	}
	if len(p) > 1 && (p[0] == '$' || p[0] == '?') {
		if n, err := strconv.Atoi(p[1:]); err == nil {
			return n
		}
	}
	return 0
}

// tableName reads "[ONLY] name[.name…]" and returns the name as written,
// without an alias; "" if there is none or a part after a dot is missing.
func tableName(s *Scanner) string {
	t := nextSignificant(s)
	if t.Kind == Word && strings.EqualFold(s.Text(t), "ONLY") {
		t = nextSignificant(s)
	}
	if t.Kind != Word && t.Kind != QuotedIdent {
		return ""
	}
	start, end := t.Start, t.End
	for {
		save := *s
		if dot := nextSignificant(s); dot.Kind != Punct || s.src[dot.Start] != '.' {
			*s = save
			break
		}
		part := nextSignificant(s)
		if part.Kind != Word && part.Kind != QuotedIdent {
			return ""
		}
		end = part.End
	}
	return s.src[start:end]
}

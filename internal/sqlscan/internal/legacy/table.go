package legacy

import "strings"

// afterTable are words that may follow a table reference and are not an
// alias.
var afterTable = [...]string{"WHERE", "LEFT", "RIGHT", "FULL", "INNER", "CROSS", "JOIN", "NATURAL", "ON", "USING",
	"GROUP", "ORDER", "LIMIT", "OFFSET", "FETCH", "FOR", "UNION", "EXCEPT", "INTERSECT", "WINDOW", "HAVING",
	"TABLESAMPLE", "RETURNING", "LATERAL"}

// FirstTable returns how the first table after the first FROM at the
// outermost level of src is referred to: its alias if it has one, else its
// (possibly qualified) name; "" if there is none. It serves error messages
// that suggest a locking clause's OF list.
func FirstTable(src string, d Dialect) string {
	s := New(src, d)
	depth := 0
	for {
		t := nextSignificant(&s)
		switch {
		case t.Kind == EOF:
			return ""
		case t.Kind == Punct && src[t.Start] == '(':
			depth++
		case t.Kind == Punct && src[t.Start] == ')':
			depth--
		case depth == 0 && t.Kind == Word && strings.EqualFold(s.Text(t), "FROM"):
			return tableRef(&s)
		}
	}
}

// tableRef reads "name[.name…] [[AS] alias]" and returns the alias or name.
func tableRef(s *Scanner) string {
	name := tableName(s)
	if name == "" {
		return ""
	}
	alias := nextSignificant(s)
	if alias.Kind == Word && strings.EqualFold(s.Text(alias), "AS") {
		alias = nextSignificant(s)
	}
	switch alias.Kind {
	case QuotedIdent:
		return s.Text(alias)
	case Word:
		for _, k := range afterTable {
			if strings.EqualFold(s.Text(alias), k) {
				return name
			}
		}
		return s.Text(alias)
	}
	return name
}

// nextSignificant returns the next token that is neither space nor comment.
func nextSignificant(s *Scanner) Token {
	for {
		t := s.Next()
		if t.Kind != Space && t.Kind != Comment {
			return t
		}
	}
}

// FirstWord returns the first word of src, skipping space and comments;
// "" if src does not start with a word.
func FirstWord(src string) string {
	s := New(src, Postgres)
	if t := nextSignificant(&s); t.Kind == Word {
		return s.Text(t)
	}
	return ""
}

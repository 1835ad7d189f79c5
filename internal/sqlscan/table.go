package sqlscan

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
	return firstTable(src, newCursor(src, d))
}

// firstTable returns the first table of the text src at c (as FirstTable),
// reading up to that table.
func firstTable(src string, c cursor) string {
	depth := 0
	for {
		t := c.nextSignificant()
		switch {
		case t.Kind == EOF:
			return ""
		case c.at(t, '('):
			depth++
		case c.at(t, ')'):
			depth--
		case depth == 0 && t.Kind == Word && strings.EqualFold(c.text(t), "FROM"):
			return tableRef(src, &c)
		}
	}
}

// tableRef reads "name[.name…] [[AS] alias]" and returns the alias or
// name; src is c's text.
func tableRef(src string, c *cursor) string {
	name := tableName(src, c)
	if name == "" {
		return ""
	}
	alias := c.nextSignificant()
	if alias.Kind == Word && strings.EqualFold(c.text(alias), "AS") {
		alias = c.nextSignificant()
	}
	switch alias.Kind {
	case QuotedIdent:
		return src[alias.Start:alias.End]
	case Word:
		for _, k := range afterTable {
			if strings.EqualFold(c.text(alias), k) {
				return name
			}
		}
		return src[alias.Start:alias.End]
	}
	return name
}

// FirstWord returns the first word of src, skipping space and comments;
// "" if src does not start with a word.
func FirstWord(src string) string {
	c := newCursor(src, Postgres)
	if t := c.nextSignificant(); t.Kind == Word {
		return c.text(t)
	}
	return ""
}

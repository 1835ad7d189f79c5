package sqlscan

import "strings"

// writeVerbs start statements that write (or change the schema).
var writeVerbs = [...]string{"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "VACUUM", "REINDEX", "UPSERT"}

// dmlVerbs make a WITH statement a write.
var dmlVerbs = [...]string{"INSERT", "UPDATE", "DELETE", "REPLACE"}

// IsWrite reports whether the statement src (SQLite) writes: it starts with
// INSERT, UPDATE, DELETE, REPLACE, CREATE, DROP, ALTER, VACUUM or REINDEX,
// or it is a WITH … whose body has one of the DML verbs. It allocates
// nothing and reads only the first word for other statements.
func IsWrite(src string) bool {
	s := New(src, SQLite)
	t := nextSignificant(&s)
	if t.Kind != Word {
		return false
	}
	w := s.Text(t)
	for _, v := range writeVerbs {
		if len(w) == len(v) && strings.EqualFold(w, v) {
			return true
		}
	}
	if !strings.EqualFold(w, "WITH") {
		return false
	}
	for t = nextSignificant(&s); t.Kind != EOF; t = nextSignificant(&s) {
		if t.Kind != Word {
			continue
		}
		w = s.Text(t)
		for _, v := range dmlVerbs {
			if len(w) == len(v) && strings.EqualFold(w, v) {
				return true
			}
		}
	}
	return false
}

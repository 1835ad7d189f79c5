package sqlscan

import (
	"fmt"
	"strings"
	"testing"
)

// classifyCases are texts of every kind Classify tells apart.
var classifyCases = []string{
	`SELECT * FROM jobs WHERE id = $1 FOR UPDATE`,
	`SELECT * FROM jobs j WHERE id = $1 FOR UPDATE OF j SKIP LOCKED /* lockhooks:keep-for-update */`,
	`SELECT pg_advisory_lock(42)`,
	`SELECT pg_try_advisory_xact_lock($1::bigint) AS ok FROM jobs FOR SHARE`,
	`/* reset */ DISCARD ALL`,
	`INSERT INTO forms (id) VALUES (?)`,
	`WITH t AS (DELETE FROM runs RETURNING *) SELECT * FROM t FOR UPDATE`,
	`SELECT 1; UPDATE t SET format = 'x' WHERE id IN (SELECT id FROM t FOR UPDATE)`,
	`SELECT "users"."id" FROM "users" AS "u" WHERE "u"."format" = 'for update'`,
	stmt200,
}

// countTokens returns the number of tokens of src that are not white space.
func countTokens(src string, d Dialect) int {
	s := New(src, d)
	n := 0
	for t := s.Next(); t.Kind != EOF; t = s.Next() {
		if t.Kind != Space {
			n++
		}
	}
	return n
}

// disagreement returns how Classify(src, d, op), one pass whose parsers
// share a buffer of tokens, differs from the exported single-purpose
// functions, each of which reads the text on its own, or "".
//
// When Classify was introduced, this also compared both with a frozen copy
// of the package as it was before (internal/legacy in commit 74e5079,
// removed in the commit after the merge of branch issue-15-classify):
// FuzzClassify ran 14.5 million inputs against it without a difference.
// Restore it from git to re-check a change of the lexer that way.
func disagreement(src string, d Dialect, op Op) string {
	cl := Classify(src, d, op)
	text, info := Rewrite(src, d, op)
	if cl.Text != text || cl.Locks != info {
		return fmt.Sprintf("text/locks %q %b, Rewrite %q %b", cl.Text, cl.Locks, text, info)
	}
	var want string
	if d == Postgres && MayAdvisory(src) {
		if a := ParseAdvisory(src); len(a.Calls) > 0 || a.DiscardAll || a.Uncertain {
			want = fmt.Sprintf("%+v", a)
		}
	}
	var got string
	if cl.Advisory != nil {
		got = fmt.Sprintf("%+v", *cl.Advisory)
	}
	if got != want {
		return fmt.Sprintf("advisory %s, ParseAdvisory %s", got, want)
	}
	if d == SQLite && cl.Write != IsWrite(src) {
		return fmt.Sprintf("write %v, IsWrite the opposite", cl.Write)
	}
	if !cl.Locks.Locks() && cl.FirstTable != "" {
		return fmt.Sprintf("first table %q of a text without a locking clause", cl.FirstTable)
	}
	if table := FirstTable(src, d); cl.Locks.Locks() && cl.FirstTable != table {
		return fmt.Sprintf("first table %q, FirstTable %q", cl.FirstTable, table)
	}
	if n := countTokens(src, d); n <= maxShared && cl.Tokens > n {
		return fmt.Sprintf("lexed %d tokens of %d", cl.Tokens, n)
	}
	return ""
}

// classifyOps are the dialect and operation pairs a connection uses.
var classifyOps = []struct {
	d  Dialect
	op Op
}{{Postgres, NoKeyUpdate}, {Postgres, Inspect}, {SQLite, Strip}}

func TestClassifyAgreesWithSeparatePasses(t *testing.T) {
	var texts []string
	for _, c := range noKeyCases {
		texts = append(texts, c.in)
	}
	texts = append(texts, classifyCases...)
	for _, src := range texts {
		for _, c := range classifyOps {
			if msg := disagreement(src, c.d, c.op); msg != "" {
				t.Errorf("Classify(%q, %d, %d): %s", src, c.d, c.op, msg)
			}
		}
	}
}

// TestClassifyScansOnce: a classification lexes each token of its text at
// most once, though up to four parsers read it; a text that may hold a
// locking clause is read to its end, so exactly once.
func TestClassifyScansOnce(t *testing.T) {
	for _, src := range classifyCases {
		for _, c := range classifyOps {
			cl := Classify(src, c.d, c.op)
			n := countTokens(src, c.d)
			if cl.Tokens > n || MayLock(src) && cl.Tokens != n {
				t.Errorf("Classify(%q, %d) lexed %d tokens, the text has %d", src, c.d, cl.Tokens, n)
			}
		}
	}
	// Past the shared tokens a text is still classified right, at the cost
	// of lexing the tail again for each parser that reads it.
	long := "SELECT " + strings.Repeat("a, ", maxShared) + "pg_advisory_lock(1) FROM t FOR UPDATE"
	if msg := disagreement(long, Postgres, NoKeyUpdate); msg != "" {
		t.Error(msg)
	}
	// A long statement that one parser alone reads to its end (a bulk
	// INSERT whose "format" passes the "for" pre-check) is lexed once
	// however long it is.
	for _, c := range []struct {
		d     Dialect
		tuple string
	}{{Postgres, "($1, $2, $3), "}, {SQLite, "(?, ?, ?), "}} {
		bulk := "INSERT INTO platform_events (id, format, payload) VALUES " + strings.Repeat(c.tuple, 300) + "(0, 0, 0)"
		cl := Classify(bulk, c.d, NoKeyUpdate)
		if n := countTokens(bulk, c.d); cl.Tokens != n {
			t.Errorf("a bulk INSERT (dialect %d) lexed %d tokens, the text has %d", c.d, cl.Tokens, n)
		}
	}
}

func TestClassifyAllocations(t *testing.T) {
	cases := []struct {
		src    string
		d      Dialect
		allocs float64
	}{
		{stmt200, Postgres, 0},                           // scanned, nothing to change
		{"INSERT INTO forms (id) VALUES (?)", SQLite, 0}, // a write with "for" in a name
		{"SELECT * FROM t FOR UPDATE", Postgres, 1},      // the rewritten text
		{"SELECT pg_advisory_lock(1)", Postgres, 3},      // the Advisory and its calls, as ParseAdvisory
		{"select 1 -- advisory", Postgres, 0},            // parsed, nothing relevant
		{"SELECT " + strings.Repeat("a, ", maxShared) + "1 FROM t FOR SHARE", Postgres, 0},
	}
	for _, c := range cases {
		if n := testing.AllocsPerRun(100, func() { Classify(c.src, c.d, NoKeyUpdate) }); n != c.allocs {
			t.Errorf("Classify(%.40q) allocated %v times, want %v", c.src, n, c.allocs)
		}
	}
}

// FuzzClassify checks that Classify, in one pass, agrees with the exported
// single-purpose functions on every text, and that it never lexes a token
// twice.
func FuzzClassify(f *testing.F) {
	addSeeds(f)
	for _, s := range classifyCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		for _, c := range classifyOps {
			if msg := disagreement(src, c.d, c.op); msg != "" {
				t.Fatalf("Classify(%q, %d, %d): %s", src, c.d, c.op, msg)
			}
		}
	})
}

package sqlscan

import (
	"strings"
	"testing"
)

func addSeeds(f *testing.F) {
	for _, c := range noKeyCases {
		f.Add(c.in)
	}
	for _, s := range []string{"SELECT pg_advisory_lock($1)", "SELECT pg_try_advisory_lock(1, 2)", "DISCARD ALL", "$", "$$", "$a", "E'", "U&'", "/*", "--", `"`, "(((", ")))", "FOR", "for no key", "FOR UPDATE OF", "FOR SKIP",
		"WITH t AS (SELECT replace(a,' ','-') FROM u) SELECT * FROM t", "WITH RECURSIVE t(n) AS NOT MATERIALIZED ((VALUES (1))) INSERT INTO u SELECT * FROM t",
		"WITH a AS (WITH b AS (SELECT 1) DELETE FROM c) SELECT 1", "SELECT 1; REPLACE INTO t VALUES (1)", "WITH t AS (", "WITH t(", "WITH ,", "/* /* */ */ INSERT INTO t VALUES (1)"} {
		f.Add(s)
	}
}

// FuzzRewrite checks, for any text: the lexer does not panic and covers the
// text; the rewrite only inserts "NO KEY " before UPDATE and is idempotent;
// the SQLite strip only removes bytes.
func FuzzRewrite(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, in string) {
		for _, d := range []Dialect{Postgres, SQLite} {
			s := New(in, d)
			end := 0
			for tok := s.Next(); tok.Kind != EOF; tok = s.Next() {
				if tok.Start != end || tok.End <= tok.Start || tok.End > len(in) {
					t.Fatalf("token %v after offset %d", tok, end)
				}
				end = tok.End
			}
			if end != len(in) {
				t.Fatalf("tokens end at %d of %d", end, len(in))
			}
		}

		out, info := Rewrite(in, Postgres, NoKeyUpdate)
		if err := onlyInsertsNoKey(in, out); err != "" {
			t.Fatalf("rewrite of %q gave %q: %s", in, out, err)
		}
		if again, _ := Rewrite(out, Postgres, NoKeyUpdate); again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", in, out, again)
		}
		if out != in && info&ForUpdate == 0 {
			t.Fatalf("changed %q without reporting FOR UPDATE", in)
		}
		if same, _ := Rewrite(in, Postgres, Inspect); same != in {
			t.Fatalf("Inspect changed the text")
		}

		adv := ParseAdvisory(in)
		if len(adv.Calls) > 0 && !MayAdvisory(in) {
			t.Fatalf("%q has advisory calls but MayAdvisory is false", in)
		}

		// IsWrite never panics, and a statement that begins with a write
		// verb is a write.
		ls := newCursor(in, SQLite)
		if first := ls.nextSignificant(); first.Kind == Word && isVerb(ls.text(first), writeVerbs[:]) && !IsWrite(in) {
			t.Fatalf("IsWrite(%q) is false for a statement that begins with %s", in, ls.text(first))
		}

		stripped, sinfo := Rewrite(in, SQLite, Strip)
		if !isSubsequence(stripped, in) {
			t.Fatalf("strip of %q gave %q, which is not a subsequence", in, stripped)
		}
		if stripped != in && !sinfo.Locks() {
			t.Fatalf("stripped %q without reporting a lock", in)
		}
	})
}

// onlyInsertsNoKey returns "" if out is in with "NO KEY " inserted only
// directly before the word UPDATE.
func onlyInsertsNoKey(in, out string) string {
	const ins = "NO KEY "
	i, j := 0, 0
	for j < len(out) {
		if i < len(in) && in[i] == out[j] {
			i, j = i+1, j+1
			continue
		}
		if !strings.HasPrefix(out[j:], ins) {
			return "differs at output offset " + itoa(j)
		}
		if rest := out[j+len(ins):]; len(rest) < 6 || !strings.EqualFold(rest[:6], "UPDATE") {
			return "NO KEY inserted before something other than UPDATE"
		}
		j += len(ins)
	}
	if i != len(in) {
		return "input not fully present"
	}
	return ""
}

func isSubsequence(sub, s string) bool {
	i := 0
	for j := 0; j < len(s) && i < len(sub); j++ {
		if s[j] == sub[i] {
			i++
		}
	}
	return i == len(sub)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

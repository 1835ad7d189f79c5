package sqlscan

import (
	"strings"
	"testing"
)

// tokens returns "Kind:text" for each token of src.
func tokens(src string, d Dialect) []string {
	s := New(src, d)
	var out []string
	for t := s.Next(); t.Kind != EOF; t = s.Next() {
		if t.Kind != Space {
			out = append(out, t.Kind.String()+":"+s.Text(t))
		}
	}
	return out
}

func TestScannerTokens(t *testing.T) {
	cases := []struct {
		src  string
		d    Dialect
		want string
	}{
		{`SELECT 'it''s' FROM t`, Postgres, `Word:SELECT String:'it''s' Word:FROM Word:t`},
		{`E'a\'b' x`, Postgres, `String:E'a\'b' Word:x`},
		{`e'\\' x`, Postgres, `String:e'\\' Word:x`},
		{`'a\' x`, Postgres, `String:'a\' Word:x`}, // standard_conforming_strings
		{`U&'d\0061t' U&"x"`, Postgres, `String:U&'d\0061t' QuotedIdent:U&"x"`},
		{`B'101' X'ff' N'n'`, Postgres, `String:B'101' String:X'ff' String:N'n'`},
		{`"for ""update""" y`, Postgres, `QuotedIdent:"for ""update""" Word:y`},
		{`$$ FOR UPDATE $$ z`, Postgres, `String:$$ FOR UPDATE $$ Word:z`},
		{`$fn$ a $$ b $fn$ z`, Postgres, `String:$fn$ a $$ b $fn$ Word:z`},
		{`$1 $22`, Postgres, `Param:$1 Param:$22`},
		{`a$b$ c`, Postgres, `Word:a$b$ Word:c`},
		{`x-- FOR UPDATE` + "\n" + `y`, Postgres, `Word:x Comment:-- FOR UPDATE Word:y`},
		{`/* a /* b */ c */ d`, Postgres, `Comment:/* a /* b */ c */ Word:d`},
		{`/* a /* b */ c */ d`, SQLite, `Comment:/* a /* b */ Word:c Punct:* Punct:/ Word:d`},
		{`a;b`, Postgres, `Word:a Punct:; Word:b`},
		{"`q` [b c] ?1 :n @m $v", SQLite, "QuotedIdent:`q` QuotedIdent:[b c] Param:?1 Param::n Param:@m Param:$v"},
		{`1.5e3 .5 0x1F`, Postgres, `Number:1.5e3 Number:.5 Number:0x1F`},
		{`'unterminated`, Postgres, `String:'unterminated`},
		{`$tag$ never closed`, Postgres, `String:$tag$ never closed`},
		{`/* open`, Postgres, `Comment:/* open`},
		{`a::int`, Postgres, `Word:a Punct:: Punct:: Word:int`},
	}
	for _, c := range cases {
		if got := strings.Join(tokens(c.src, c.d), " "); got != c.want {
			t.Errorf("%q:\n got %s\nwant %s", c.src, got, c.want)
		}
	}
}

// Tokens cover the text without gaps or overlaps.
func TestScannerCoversText(t *testing.T) {
	for _, src := range []string{`SELECT $a$x$a$, E'\'', "q", 1 /* c */ -- end`, "$", "E", "U&", "'", `"`, "$1$", "[x"} {
		for _, d := range []Dialect{Postgres, SQLite} {
			s := New(src, d)
			end := 0
			for tok := s.Next(); tok.Kind != EOF; tok = s.Next() {
				if tok.Start != end || tok.End <= tok.Start {
					t.Fatalf("%q: token %v after offset %d", src, tok, end)
				}
				end = tok.End
			}
			if end != len(src) {
				t.Fatalf("%q: tokens end at %d of %d", src, end, len(src))
			}
		}
	}
}

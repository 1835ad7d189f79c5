package sqlscan

import "strings"

// Dialect selects the lexical rules.
type Dialect uint8

// The dialects.
const (
	Postgres Dialect = iota
	SQLite
)

// Kind is the kind of a token.
type Kind uint8

// Token kinds.
const (
	EOF         Kind = iota
	Space            // white space
	Comment          // -- … or /* … */
	Word             // a keyword or an unquoted identifier
	QuotedIdent      // "…" (and `…`, […] on SQLite)
	String           // any string literal, including dollar-quoted ones
	Number           // a numeric literal
	Param            // $1, ?, ?1, :name, @name, $name (SQLite)
	Punct            // any other single byte: ( ) , ; . operators
)

var kindNames = [...]string{"EOF", "Space", "Comment", "Word", "QuotedIdent", "String", "Number", "Param", "Punct"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(?)"
}

// Token is one lexical token: src[Start:End].
type Token struct {
	Kind       Kind
	Start, End int
}

// Scanner splits SQL text into tokens.
type Scanner struct {
	src     string
	pos     int
	dialect Dialect
}

// New returns a scanner over src.
func New(src string, d Dialect) Scanner {
	return Scanner{src: src, dialect: d}
}

// Reset makes s scan src from its start.
func (s *Scanner) Reset(src string) { s.src, s.pos = src, 0 }

// Text returns the source text of t.
func (s *Scanner) Text(t Token) string { return s.src[t.Start:t.End] }

// Pos returns the offset of the next token.
func (s *Scanner) Pos() int { return s.pos }

// Next returns the next token; at the end of the text it returns a token of
// kind EOF (repeatedly). Unterminated literals and comments run to the end.
func (s *Scanner) Next() Token {
	start := s.pos
	if start >= len(s.src) {
		return Token{Kind: EOF, Start: start, End: start}
	}
	kind := s.scan()
	return Token{Kind: kind, Start: start, End: s.pos}
}

// nextNonSpace is SkipSpace then Next in one call: the parsers' hot loop.
// The commonest tokens (a plain word, a "quoted identifier", a one-byte
// operator) are lexed here, dispatched by one table look-up; the rest by
// scan.
func (s *Scanner) nextNonSpace() Token {
	src, pos := s.src, s.pos
	for ; pos < len(src); pos++ {
		switch fast[src[pos]] {
		case fastSpace:
			continue
		case fastWord:
			if end, ok := s.plainWord(pos); ok {
				s.pos = end
				return Token{Kind: Word, Start: pos, End: end}
			}
		case fastQuote:
			if end, ok := quotedIdent(src, pos); ok {
				s.pos = end
				return Token{Kind: QuotedIdent, Start: pos, End: end}
			}
		case fastPunct:
			s.pos = pos + 1
			return Token{Kind: Punct, Start: pos, End: pos + 1}
		}
		s.pos = pos
		kind := s.scan()
		return Token{Kind: kind, Start: pos, End: s.pos}
	}
	s.pos = pos
	return Token{Kind: EOF, Start: pos, End: pos}
}

// plainWord returns the end of the word starting at pos, unless it is a
// one-letter prefix of a literal (E'…', U&"…"), which scan reads.
func (s *Scanner) plainWord(pos int) (int, bool) {
	src := s.src
	mask := clIdentStart | clDigit
	if s.dialect == Postgres {
		mask |= clDollar
	}
	end := pos + 1
	for end < len(src) && class[src[end]]&mask != 0 {
		end++
	}
	return end, end > pos+1 || end == len(src) || src[end] != '\'' && src[end] != '&'
}

// quotedIdent returns the end of the "quoted identifier" at pos, unless
// it holds a doubled quote or is unterminated, which scan reads.
func quotedIdent(src string, pos int) (int, bool) {
	for end := pos + 1; end < len(src); end++ {
		if src[end] == '"' {
			end++
			return end, end == len(src) || src[end] != '"'
		}
	}
	return 0, false
}

// scan consumes one token at s.pos and returns its kind.
func (s *Scanner) scan() Kind {
	src := s.src
	c := src[s.pos]
	switch class[c] &^ clDollar {
	case clIdentStart:
		return s.word()
	case clSpace:
		s.SkipSpace()
		return Space
	case clDigit:
		s.number()
		return Number
	}
	switch {
	case c == '"':
		s.quoted('"', false)
		return QuotedIdent
	case c == '\'':
		s.quoted('\'', false)
		return String
	case c == '-' && s.peek(1) == '-':
		for s.pos < len(src) && src[s.pos] != '\n' {
			s.pos++
		}
		return Comment
	case c == '/' && s.peek(1) == '*':
		s.blockComment()
		return Comment
	case c == '$':
		return s.dollar()
	case c == '.' && isDigit(s.peek(1)):
		s.number()
		return Number
	case s.dialect == SQLite && c == '`':
		s.quoted('`', false)
		return QuotedIdent
	case s.dialect == SQLite && c == '[':
		s.pos++
		for s.pos < len(src) && src[s.pos] != ']' {
			s.pos++
		}
		s.skip(1)
		return QuotedIdent
	case c == '?':
		s.pos++
		for s.pos < len(src) && isDigit(src[s.pos]) {
			s.pos++
		}
		return Param
	case s.dialect == SQLite && (c == ':' || c == '@') && isIdentStart(s.peek(1)):
		s.pos++
		for s.pos < len(src) && isIdentCont(src[s.pos]) {
			s.pos++
		}
		return Param
	}
	s.pos++
	return Punct
}

// number scans a numeric literal (loosely: digits, letters, '_' and '.').
func (s *Scanner) number() {
	for s.pos < len(s.src) && (isIdentCont(s.src[s.pos]) || s.src[s.pos] == '.') {
		s.pos++
	}
}

// word scans an identifier or keyword, or a literal with a one-letter
// prefix (E'…', B'…', X'…', N'…', U&'…', U&"…").
func (s *Scanner) word() Kind {
	c := s.src[s.pos]
	if s.peek(1) == '\'' {
		switch c {
		case 'e', 'E':
			if s.dialect == Postgres {
				s.pos++
				s.quoted('\'', true)
				return String
			}
		case 'b', 'B', 'x', 'X', 'n', 'N':
			s.pos++
			s.quoted('\'', false)
			return String
		}
	}
	if (c == 'u' || c == 'U') && s.peek(1) == '&' && s.dialect == Postgres {
		switch s.peek(2) {
		case '\'':
			s.pos += 2
			s.quoted('\'', false)
			return String
		case '"':
			s.pos += 2
			s.quoted('"', false)
			return QuotedIdent
		}
	}
	mask := clIdentStart | clDigit
	if s.dialect == Postgres {
		mask |= clDollar
	}
	src, pos := s.src, s.pos
	for pos < len(src) && class[src[pos]]&mask != 0 {
		pos++
	}
	s.pos = pos
	return Word
}

// quoted scans a literal opened by q at s.pos; a doubled q stands for
// itself, and with backslash a backslash escapes the next byte.
func (s *Scanner) quoted(q byte, backslash bool) {
	src := s.src
	s.pos++ // the opening quote
	if !backslash {
		for {
			i := indexByte(src[s.pos:], q)
			if i < 0 {
				s.pos = len(src)
				return
			}
			s.pos += i + 1
			if s.pos >= len(src) || src[s.pos] != q {
				return
			}
			s.pos++ // a doubled quote
		}
	}
	for s.pos < len(src) {
		c := src[s.pos]
		switch {
		case c == '\\':
			s.skip(2)
		case c == q:
			if s.peek(1) == q {
				s.pos += 2
				continue
			}
			s.pos++
			return
		default:
			s.pos++
		}
	}
}

// blockComment scans /* … */, nested on Postgres.
func (s *Scanner) blockComment() {
	src := s.src
	depth := 0
	for s.pos < len(src) {
		switch {
		case src[s.pos] == '/' && s.peek(1) == '*':
			if depth == 0 || s.dialect == Postgres {
				depth++
			}
			s.pos += 2
		case src[s.pos] == '*' && s.peek(1) == '/':
			depth--
			s.pos += 2
			if depth == 0 {
				return
			}
		default:
			s.pos++
		}
	}
}

// dollar scans what starts with '$': a parameter ($1; $name on SQLite) or,
// on Postgres, a dollar-quoted string.
func (s *Scanner) dollar() Kind {
	src := s.src
	start := s.pos
	if isDigit(s.peek(1)) {
		s.pos++
		for s.pos < len(src) && isDigit(src[s.pos]) {
			s.pos++
		}
		return Param
	}
	if s.dialect == SQLite {
		s.pos++
		for s.pos < len(src) && (isIdentCont(src[s.pos]) || src[s.pos] == ':' || src[s.pos] == '$') {
			s.pos++
		}
		if s.pos == start+1 {
			return Punct
		}
		return Param
	}
	// $tag$ where tag is empty or an identifier without '$'.
	end := start + 1
	if end < len(src) && isIdentStart(src[end]) {
		for end < len(src) && isIdentCont(src[end]) {
			end++
		}
	}
	if end >= len(src) || src[end] != '$' {
		s.pos++
		return Punct
	}
	tag := src[start : end+1]
	s.pos = end + 1
	for s.pos < len(src) {
		if src[s.pos] == '$' && len(src)-s.pos >= len(tag) && src[s.pos:s.pos+len(tag)] == tag {
			s.pos += len(tag)
			return String
		}
		s.pos++
	}
	return String
}

// indexByte is strings.IndexByte, with a plain loop first: quoted
// identifiers and literals are mostly short, and the loop beats the call.
func indexByte(s string, c byte) int {
	n := min(len(s), 16)
	for i := 0; i < n; i++ {
		if s[i] == c {
			return i
		}
	}
	if n == len(s) {
		return -1
	}
	if i := strings.IndexByte(s[n:], c); i >= 0 {
		return n + i
	}
	return -1
}

// peek returns the byte n past s.pos, or 0 past the end.
func (s *Scanner) peek(n int) byte {
	if s.pos+n < len(s.src) {
		return s.src[s.pos+n]
	}
	return 0
}

// skip advances n bytes, stopping at the end.
func (s *Scanner) skip(n int) {
	s.pos = min(s.pos+n, len(s.src))
}

// Byte classes, looked up in one table.
const (
	clSpace uint8 = 1 << iota
	clDigit
	clIdentStart
	clDollar // '$', which continues a word on Postgres
)

var class = func() (t [256]uint8) {
	for _, c := range []byte(" \t\n\r\f\v") {
		t[c] = clSpace
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = clDigit
	}
	for c := 0; c < 256; c++ {
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c >= 0x80 {
			t[c] = clIdentStart
		}
	}
	t['$'] = clDollar
	return t
}()

// What nextNonSpace does with a byte that starts a token.
const (
	fastOther uint8 = iota // scan decides
	fastSpace
	fastWord
	fastQuote // '"'
	fastPunct // a byte that is a one-byte Punct token in both dialects
)

var fast = func() (t [256]uint8) {
	for c := range 256 {
		switch {
		case class[c] == clSpace:
			t[c] = fastSpace
		case class[c] == clIdentStart:
			t[c] = fastWord
		}
	}
	t['"'] = fastQuote
	for _, c := range []byte("(),;=+*<>!%^|~&{}]") {
		t[c] = fastPunct
	}
	return t
}()

func isSpace(c byte) bool      { return class[c] == clSpace }
func isDigit(c byte) bool      { return class[c] == clDigit }
func isIdentStart(c byte) bool { return class[c] == clIdentStart }
func isIdentCont(c byte) bool  { return class[c]&(clIdentStart|clDigit) != 0 }

// SkipSpace advances past white space, so that the next token is not Space.
func (s *Scanner) SkipSpace() {
	src, pos := s.src, s.pos
	for pos < len(src) && class[src[pos]] == clSpace {
		pos++
	}
	s.pos = pos
}

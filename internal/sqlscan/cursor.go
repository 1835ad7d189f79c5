package sqlscan

// maxShared is how many tokens (neither space nor end) one classification
// keeps for its parsers to share: enough for ORM statements with dozens of
// columns, small enough to live on the stack. A text with more has the
// tokens past them lexed again by each parser that reads that far; it still
// allocates nothing.
const maxShared = 128

// sharedTokens are the tokens of one text lexed once and read by several
// parsers (Classify's): the first parser to reach a token lexes it, the
// others read it here.
type sharedTokens struct {
	toks  [maxShared]packedToken
	n     int // tokens kept
	lexed int // tokens lexed, spaces not counted
}

// packedToken is a Token in 12 bytes, so that sharedTokens is cheap to
// zero. Texts of 4 GiB or more are not shared.
type packedToken struct {
	start, end uint32
	kind       Kind
}

// cursor reads the tokens of a text other than white space; mark and reset
// rewind it. A copy reads on independently (from the start, for Classify's
// parsers). With shared tokens, a token any cursor of the text has read is
// not lexed again; without, every read lexes.
type cursor struct {
	s      Scanner
	shared *sharedTokens // nil: lex every token
	i      int           // index in shared.toks of the next token
}

// newCursor returns a cursor at the start of src that lexes every token.
func newCursor(src string, d Dialect) cursor {
	return cursor{s: New(src, d)}
}

// newSharedCursor returns a cursor at the start of src that keeps the
// tokens it lexes in sh for the cursors copied from it.
func newSharedCursor(src string, d Dialect, sh *sharedTokens) cursor {
	c := newCursor(src, d)
	if uint64(len(src)) < 1<<32 {
		c.shared = sh
	}
	return c
}

// mark is a position of a cursor. It holds no pointer, so that saving and
// restoring positions through a *cursor keeps shared tokens on the stack.
type mark struct{ pos, i int }

// mark returns the cursor's position.
func (c *cursor) mark() mark { return mark{c.s.pos, c.i} }

// reset moves the cursor back to m.
func (c *cursor) reset(m mark) { c.s.pos, c.i = m.pos, m.i }

// src returns the text.
func (c *cursor) src() string { return c.s.src }

// text returns the source text of t.
func (c *cursor) text(t Token) string { return c.s.src[t.Start:t.End] }

// pos returns the offset just past the last token read.
func (c *cursor) pos() int { return c.s.pos }

// at reports whether t is the single byte b (a Punct token).
func (c *cursor) at(t Token, b byte) bool { return t.Kind == Punct && c.s.src[t.Start] == b }

// next returns the next token that is not white space (comments included);
// at the end, a token of kind EOF.
func (c *cursor) next() Token {
	sh := c.shared
	if sh != nil && c.i < sh.n {
		p := sh.toks[c.i]
		c.i++
		c.s.pos = int(p.end)
		return Token{Kind: p.kind, Start: int(p.start), End: int(p.end)}
	}
	t := c.s.nextNonSpace()
	if sh != nil && t.Kind != EOF {
		sh.lexed++
		if c.i == sh.n && sh.n < len(sh.toks) {
			sh.toks[sh.n] = packedToken{start: uint32(t.Start), end: uint32(t.End), kind: t.Kind}
			sh.n++
			c.i++
		}
	}
	return t
}

// nextSignificant returns the next token that is neither space nor comment.
func (c *cursor) nextSignificant() Token {
	for {
		if t := c.next(); t.Kind != Comment {
			return t
		}
	}
}

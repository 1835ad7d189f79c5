package sqlscan

// Classification is everything a connection needs to know about one
// statement text, found in one pass over its tokens: each token is lexed
// once and read by every parser that needs it (the locking-clause walker,
// the advisory-call parser, the write test and the first-table reader).
type Classification struct {
	// Text is the text to send: the statement with the Op applied to its
	// locking clauses (the statement itself when nothing changed).
	Text string
	// Locks are the row-locking clauses as written (as Rewrite reports).
	Locks LockInfo
	// Advisory is what the text does with advisory locks (Postgres, as
	// ParseAdvisory reports), or nil when it calls no advisory-lock
	// function, is not DISCARD ALL and mentions no advisory lock.
	Advisory *Advisory
	// Write reports whether the text writes (SQLite, as IsWrite reports;
	// false on Postgres).
	Write bool
	// FirstTable is how the first table after the outermost FROM is
	// referred to (as FirstTable reports), found only for a text with a
	// row-locking clause: it serves the message that suggests the clause's
	// OF list, and reading up to the FROM would cost a statement without
	// one (an INSERT … VALUES reads to its end) a second pass over its
	// tail. "" for other texts.
	FirstTable string
	// Tokens is how many tokens (white space not counted) the
	// classification lexed. It is at most the number of tokens in the text
	// when the text has no more than 128: no token was lexed twice.
	Tokens int
}

// Classify finds, in one pass over src, the text to send after applying
// op to its locking clauses and every other fact of Classification. A text
// without "for" (MayLock) is not walked for locking clauses; on Postgres, a
// text without "advisory" or DISCARD (MayAdvisory) is not parsed for
// advisory calls. It allocates the rewritten text and the Advisory, when
// there are any, and as ParseAdvisory does, the lower-cased names of
// upper-case words in a text it parses for advisory calls.
func Classify(src string, d Dialect, op Op) Classification {
	// The strings Classify returns are cut from src, never from a cursor's
	// text, so that the cursors and sh stay on the stack.
	var sh sharedTokens
	start := newSharedCursor(src, d, &sh)
	cl := Classification{Text: src}
	if MayLock(src) {
		w := walker{c: start, op: op}
		w.walk()
		cl.Text, cl.Locks = w.result(src)
	}
	if d == Postgres && MayAdvisory(src) {
		if a := parseAdvisory(src, start); a.relevant() {
			cl.Advisory = new(Advisory) // only a relevant parse escapes
			*cl.Advisory = a
		}
	}
	if d == SQLite {
		cl.Write = isWrite(start)
	}
	if cl.Locks.Locks() {
		cl.FirstTable = firstTable(src, start)
	}
	cl.Tokens = sh.lexed
	return cl
}

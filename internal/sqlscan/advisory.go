package sqlscan

import (
	"strconv"
	"strings"
)

// AdvisoryFunc describes a Postgres advisory-lock function by its traits.
type AdvisoryFunc uint8

// AdvisoryFunc bits; pg_advisory_lock has none of them.
const (
	FnShared    AdvisoryFunc = 1 << iota // …_shared
	FnTry                                // pg_try_…: never waits, returns whether it got the lock
	FnXact                               // …_xact_…: released at the end of the transaction
	FnUnlock                             // pg_advisory_unlock[_shared]: returns whether it held the lock
	FnUnlockAll                          // pg_advisory_unlock_all()
)

// advisoryFuncs maps each function name to its traits.
var advisoryFuncs = [...]struct {
	name string
	fn   AdvisoryFunc
}{
	{"pg_advisory_lock", 0},
	{"pg_advisory_lock_shared", FnShared},
	{"pg_try_advisory_lock", FnTry},
	{"pg_try_advisory_lock_shared", FnTry | FnShared},
	{"pg_advisory_unlock", FnUnlock},
	{"pg_advisory_unlock_shared", FnUnlock | FnShared},
	{"pg_advisory_unlock_all", FnUnlockAll},
	{"pg_advisory_xact_lock", FnXact},
	{"pg_advisory_xact_lock_shared", FnXact | FnShared},
	{"pg_try_advisory_xact_lock", FnTry | FnXact},
	{"pg_try_advisory_xact_lock_shared", FnTry | FnXact | FnShared},
}

// Name returns the function's name.
func (f AdvisoryFunc) Name() string {
	for _, a := range advisoryFuncs {
		if a.fn == f {
			return a.name
		}
	}
	return "pg_advisory_?"
}

// ArgKind says how an advisory-lock key argument is given.
type ArgKind uint8

// Argument kinds.
const (
	ArgExpr    ArgKind = iota // anything else: hashtext('x'), a column, a subquery
	ArgLiteral                // an integer literal, possibly negative or cast
	ArgParam                  // a bind parameter $n, possibly cast
)

// Arg is one key argument.
type Arg struct {
	Kind  ArgKind
	Value int64  // the literal's value
	Param int    // the parameter's number (1-based)
	Text  string // the argument as written, for ArgExpr
}

// AdvisoryCall is one call of an advisory-lock function in a text.
type AdvisoryCall struct {
	Func  AdvisoryFunc
	Args  [2]Arg
	NArgs int // 1: a bigint key; 2: two int4 keys; 0: pg_advisory_unlock_all
}

// Advisory is what a text does with advisory locks.
type Advisory struct {
	Calls []AdvisoryCall
	// Simple: the text is the one statement "SELECT call" (optionally with
	// an alias, a cast or a trailing semicolon), so the call runs exactly
	// once and its result is the statement's only value.
	Simple bool
	// DiscardAll: the text is DISCARD ALL, which releases session locks.
	DiscardAll bool
}

// MayAdvisory reports whether src may call an advisory-lock function or
// DISCARD ALL: it contains "advisory" or starts with "discard", in any
// case. Text without them costs a byte search.
func MayAdvisory(src string) bool {
	if hasAdvisory(src, 'v') || hasAdvisory(src, 'V') {
		return true
	}
	t := strings.TrimLeft(src, " \t\r\n")
	return len(t) >= 7 && strings.EqualFold(t[:7], "DISCARD")
}

// hasAdvisory reports whether s has "advisory" in any case, whose 'v' is v.
func hasAdvisory(s string, v byte) bool {
	const word = "advisory"
	for {
		i := strings.IndexByte(s, v)
		if i < 0 {
			return false
		}
		if i >= 2 && len(s)-i >= len(word)-2 && strings.EqualFold(s[i-2:i-2+len(word)], word) {
			return true
		}
		s = s[i+1:]
	}
}

// ParseAdvisory finds the advisory-lock calls in src (Postgres).
func ParseAdvisory(src string) Advisory {
	var a Advisory
	s := New(src, Postgres)
	first := nextSignificant(&s)
	if first.Kind == Word && strings.EqualFold(s.Text(first), "DISCARD") {
		if t := nextSignificant(&s); t.Kind == Word && strings.EqualFold(s.Text(t), "ALL") {
			a.DiscardAll = true
		}
		return a
	}
	simpleShape := first.Kind == Word && strings.EqualFold(s.Text(first), "SELECT")
	items := 0
	for t := first; t.Kind != EOF; t = nextSignificant(&s) {
		if t.Kind != Word {
			continue
		}
		fn, ok := advisoryFunc(&s, t)
		if !ok {
			continue
		}
		call, ok := parseCall(&s, fn)
		if !ok {
			continue
		}
		a.Calls = append(a.Calls, call)
		items++
	}
	a.Simple = simpleShape && items == 1 && isSimpleSelect(src)
	return a
}

// advisoryFunc reads a possibly pg_catalog-qualified advisory function name
// starting at t, leaving s after the name.
func advisoryFunc(s *Scanner, t Token) (AdvisoryFunc, bool) {
	name := s.Text(t)
	if strings.EqualFold(name, "pg_catalog") {
		save := *s
		dot := nextSignificant(s)
		t = nextSignificant(s)
		if dot.Kind != Punct || s.src[dot.Start] != '.' || t.Kind != Word {
			*s = save
			return 0, false
		}
		name = s.Text(t)
	}
	for _, f := range advisoryFuncs {
		if len(name) == len(f.name) && strings.EqualFold(name, f.name) {
			return f.fn, true
		}
	}
	return 0, false
}

// parseCall reads "(args)" after a function name.
func parseCall(s *Scanner, fn AdvisoryFunc) (AdvisoryCall, bool) {
	call := AdvisoryCall{Func: fn}
	if t := nextSignificant(s); t.Kind != Punct || s.src[t.Start] != '(' {
		return call, false
	}
	depth := 1
	argStart := s.Pos()
	for depth > 0 {
		t := nextSignificant(s)
		if t.Kind == EOF {
			return call, false
		}
		if t.Kind != Punct {
			continue
		}
		switch s.src[t.Start] {
		case '(':
			depth++
		case ')':
			depth--
			if depth > 0 {
				continue
			}
			fallthrough
		case ',':
			if depth != 1 && s.src[t.Start] == ',' {
				continue
			}
			text := strings.TrimSpace(s.src[argStart:t.Start])
			if text != "" {
				if call.NArgs < len(call.Args) {
					call.Args[call.NArgs] = parseArg(text)
				}
				call.NArgs++
			}
			argStart = t.End
		}
	}
	if call.NArgs > 2 {
		return call, false
	}
	return call, true
}

// parseArg classifies one argument's text.
func parseArg(text string) Arg {
	written := text
	if i := strings.Index(text, "::"); i > 0 {
		text = strings.TrimSpace(text[:i]) // a cast: $1::bigint, 42::int8
	}
	if strings.HasPrefix(text, "(") && strings.HasSuffix(text, ")") {
		text = strings.TrimSpace(text[1 : len(text)-1])
	}
	if strings.HasPrefix(text, "$") {
		if n, err := strconv.Atoi(text[1:]); err == nil && n > 0 {
			return Arg{Kind: ArgParam, Param: n}
		}
	}
	if v, err := strconv.ParseInt(strings.ReplaceAll(text, " ", ""), 10, 64); err == nil {
		return Arg{Kind: ArgLiteral, Value: v}
	}
	return Arg{Kind: ArgExpr, Text: written}
}

// isSimpleSelect reports whether src is "SELECT f(…) [[AS] alias] [;]".
func isSimpleSelect(src string) bool {
	s := New(src, Postgres)
	nextSignificant(&s) // SELECT
	if t := nextSignificant(&s); t.Kind != Word {
		return false
	}
	t := nextSignificant(&s)
	if t.Kind == Punct && s.src[t.Start] == '.' { // pg_catalog.
		if t = nextSignificant(&s); t.Kind != Word {
			return false
		}
		t = nextSignificant(&s)
	}
	if t.Kind != Punct || s.src[t.Start] != '(' {
		return false
	}
	for depth := 1; depth > 0; {
		t = nextSignificant(&s)
		switch {
		case t.Kind == EOF:
			return false
		case t.Kind == Punct && s.src[t.Start] == '(':
			depth++
		case t.Kind == Punct && s.src[t.Start] == ')':
			depth--
		}
	}
	t = nextSignificant(&s)
	if t.Kind == Word && strings.EqualFold(s.Text(t), "AS") {
		t = nextSignificant(&s)
	}
	if t.Kind == Word || t.Kind == QuotedIdent {
		t = nextSignificant(&s)
	}
	if t.Kind == Punct && s.src[t.Start] == ';' {
		t = nextSignificant(&s)
	}
	return t.Kind == EOF
}

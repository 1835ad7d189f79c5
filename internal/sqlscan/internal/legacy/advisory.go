package legacy

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
	// Column is the name of the call's output column when the text is a
	// target list (its alias, or the function's name), else "".
	Column string
}

// Advisory is what a text does with advisory locks.
type Advisory struct {
	Calls []AdvisoryCall
	// TargetList: the text is the one statement "SELECT item, item, … [;]"
	// whose every item is one advisory call (optionally qualified with
	// pg_catalog, optionally with an alias), so each call runs exactly once,
	// left to right, and each call's result is one column of one row.
	TargetList bool
	// Simple: a TargetList of one call.
	Simple bool
	// DiscardAll: the text is DISCARD ALL, which releases session locks.
	DiscardAll bool
	// Uncertain: the text mentions advisory locks where the parser cannot
	// place the effect: a name containing "advisory" that is not a call it
	// parsed (a user function, a DO or function body, a string literal, a
	// call whose arguments it cannot read). Its effect on locks must be read
	// from the server.
	Uncertain bool
	// Statements is the number of statements in the text (several run as
	// one implicit transaction in the simple protocol).
	Statements int
}

// MayAdvisory reports whether src may call an advisory-lock function or
// be DISCARD ALL: it contains "advisory" in any case, or its first word
// (after space and comments) is DISCARD. Text without them costs a byte
// search.
func MayAdvisory(src string) bool {
	if hasAdvisory(src, 'v') || hasAdvisory(src, 'V') {
		return true
	}
	t := strings.TrimLeft(src, " \t\r\n")
	if len(t) >= 7 && strings.EqualFold(t[:7], "DISCARD") {
		return true
	}
	if len(t) > 0 && (t[0] == '/' || t[0] == '-') {
		return strings.EqualFold(FirstWord(t), "DISCARD") // "/* reset */ DISCARD ALL"
	}
	return false
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

// mentionsAdvisory reports whether s contains "advisory" in any case.
func mentionsAdvisory(s string) bool { return hasAdvisory(s, 'v') || hasAdvisory(s, 'V') }

// ParseAdvisory finds the advisory-lock calls in src (Postgres) and says
// how exactly their effect can be known from the text.
func ParseAdvisory(src string) Advisory {
	var a Advisory
	s := New(src, Postgres)
	inStatement := false
	for {
		t := nextSignificant(&s)
		if t.Kind == EOF {
			break
		}
		if t.Kind == Punct && s.src[t.Start] == ';' {
			inStatement = false
			continue
		}
		if !inStatement {
			inStatement = true
			a.Statements++
			if t.Kind == Word && strings.EqualFold(s.Text(t), "DISCARD") {
				save := s
				if n := nextSignificant(&s); n.Kind == Word && strings.EqualFold(s.Text(n), "ALL") {
					a.DiscardAll = true
				}
				s = save
				continue
			}
		}
		switch t.Kind {
		case Word, QuotedIdent:
			if fn, ok := advisoryFunc(&s, t); ok {
				if call, ok := parseCall(&s, fn); ok {
					a.Calls = append(a.Calls, call)
					for i := range min(call.NArgs, 2) {
						if call.Args[i].Kind == ArgExpr && mentionsAdvisory(call.Args[i].Text) {
							a.Uncertain = true // a call inside a key: its effect is not counted
						}
					}
				} else {
					a.Uncertain = true // a call whose arguments cannot be read
				}
				continue
			}
			if mentionsAdvisory(s.Text(t)) {
				a.Uncertain = true // a user function, a column, a quoted spelling
			}
		case String:
			if mentionsAdvisory(s.Text(t)) {
				a.Uncertain = true // a DO block or function body, or just text
			}
		}
	}
	if len(a.Calls) > 0 && a.Statements == 1 {
		a.TargetList = targetList(src, a.Calls)
	}
	a.Simple = a.TargetList && len(a.Calls) == 1
	return a
}

// identName returns the name an identifier token denotes: unquoted words
// fold to lower case, quoted ones keep their case with "" undoubled.
func identName(s *Scanner, t Token) string {
	text := s.Text(t)
	if t.Kind == QuotedIdent {
		if len(text) >= 2 {
			text = text[1 : len(text)-1]
		}
		return strings.ReplaceAll(text, `""`, `"`)
	}
	return strings.ToLower(text)
}

// isIdent reports whether t is an identifier token.
func isIdent(t Token) bool { return t.Kind == Word || t.Kind == QuotedIdent }

// advisoryFunc reads a possibly pg_catalog-qualified advisory function name
// starting at t, leaving s after the name. Quoted names match only as
// Postgres resolves them: "pg_advisory_lock" does, "PG_ADVISORY_LOCK" does
// not.
func advisoryFunc(s *Scanner, t Token) (AdvisoryFunc, bool) {
	if t.Kind == Word && len(s.Text(t)) > 40 {
		return 0, false
	}
	name := identName(s, t)
	if name == "pg_catalog" {
		save := *s
		dot := nextSignificant(s)
		t = nextSignificant(s)
		if dot.Kind != Punct || s.src[dot.Start] != '.' || !isIdent(t) {
			*s = save
			return 0, false
		}
		name = identName(s, t)
	}
	for _, f := range advisoryFuncs {
		if name == f.name {
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
	if i := strings.Index(text, "::"); i > 0 && isTypeName(text[i+2:]) {
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

// isTypeName reports whether s is a lone type name ("bigint", "int8",
// "integer"), so that "x::type" casts x and nothing follows the cast.
func isTypeName(s string) bool {
	s = strings.TrimSpace(s)
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == ' ' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// targetList reports whether src is "SELECT item, item, … [;]" where each
// item is one of calls (in order), optionally qualified with pg_catalog and
// followed by an alias, and sets each call's Column.
func targetList(src string, calls []AdvisoryCall) bool {
	s := New(src, Postgres)
	if t := nextSignificant(&s); t.Kind != Word || !strings.EqualFold(s.Text(t), "SELECT") {
		return false
	}
	for i := range calls {
		if i > 0 {
			if t := nextSignificant(&s); t.Kind != Punct || s.src[t.Start] != ',' {
				return false
			}
		}
		t := nextSignificant(&s)
		if !isIdent(t) {
			return false
		}
		if _, ok := advisoryFunc(&s, t); !ok {
			return false
		}
		if t := nextSignificant(&s); t.Kind != Punct || s.src[t.Start] != '(' {
			return false
		}
		for depth := 1; depth > 0; {
			t := nextSignificant(&s)
			switch {
			case t.Kind == EOF:
				return false
			case t.Kind == Punct && s.src[t.Start] == '(':
				depth++
			case t.Kind == Punct && s.src[t.Start] == ')':
				depth--
			}
		}
		calls[i].Column = calls[i].Func.Name()
		save := s
		t = nextSignificant(&s)
		if t.Kind == Word && strings.EqualFold(s.Text(t), "AS") {
			t = nextSignificant(&s)
			if !isIdent(t) {
				return false
			}
		}
		if isIdent(t) && !strings.EqualFold(s.Text(t), "FROM") {
			calls[i].Column = identName(&s, t)
		} else {
			s = save
		}
	}
	t := nextSignificant(&s)
	if t.Kind == Punct && s.src[t.Start] == ';' {
		t = nextSignificant(&s)
	}
	if t.Kind != EOF {
		for i := range calls {
			calls[i].Column = ""
		}
		return false
	}
	return true
}

// TxEffect is what a text does to the session's transaction block.
type TxEffect uint8

// Transaction effects, of the last transaction-control statement in a text.
const (
	TxNone  TxEffect = iota // no transaction-control statement
	TxBegin                 // BEGIN or START TRANSACTION: a block is open
	TxEnd                   // COMMIT, END, ROLLBACK, ABORT, PREPARE TRANSACTION: no block
	TxChain                 // COMMIT/ROLLBACK AND CHAIN: a new block is open
)

// TxControl returns the effect of the last transaction-control statement
// in src (ROLLBACK TO SAVEPOINT and COMMIT PREPARED do not count).
func TxControl(src string) TxEffect {
	effect := TxNone
	s := New(src, Postgres)
	for {
		t := nextSignificant(&s)
		if t.Kind == EOF {
			return effect
		}
		if t.Kind == Punct && s.src[t.Start] == ';' {
			continue
		}
		// t starts a statement: read its words up to ';' or the end.
		first := strings.ToUpper(s.Text(t))
		if t.Kind != Word || len(first) > 8 {
			first = ""
		}
		var to, prepared, no, chain, transaction bool
		for {
			n := nextSignificant(&s)
			if n.Kind == EOF || (n.Kind == Punct && s.src[n.Start] == ';') {
				break
			}
			if n.Kind != Word {
				continue
			}
			switch w := s.Text(n); {
			case strings.EqualFold(w, "TO"):
				to = true
			case strings.EqualFold(w, "PREPARED"):
				prepared = true
			case strings.EqualFold(w, "NO"):
				no = true
			case strings.EqualFold(w, "CHAIN"):
				chain = true
			case strings.EqualFold(w, "TRANSACTION"):
				transaction = true
			}
		}
		switch first {
		case "BEGIN", "START":
			effect = TxBegin
		case "PREPARE":
			if transaction {
				effect = TxEnd
			}
		case "COMMIT", "END", "ROLLBACK", "ABORT":
			switch {
			case to || prepared: // ROLLBACK TO SAVEPOINT, COMMIT PREPARED
			case chain && !no:
				effect = TxChain
			default:
				effect = TxEnd
			}
		}
	}
}

// Package sqlscan is a lexer for PostgreSQL and SQLite statement text.
//
// It knows exactly as much SQL as lockhooks needs to find keywords safely:
// string literals (”, E'…' with backslash escapes, U&'…', B'…', X'…',
// N'…'), dollar-quoted strings ($$…$$, $tag$…$tag$, without confusing $1
// parameters), quoted identifiers ("…", and on SQLite `…` and […]), line
// comments (--), block comments (nested on Postgres, not on SQLite),
// parameters and statement boundaries. It does not parse.
//
// A Scanner works on the string it is given and never allocates. Postgres
// text is read as with standard_conforming_strings = on (the default since
// PostgreSQL 9.1): a backslash escapes only inside E'…'.
//
// It owns no state: a Scanner is a value over the text it is given.
// It imports nothing of lockhooks' (only the standard library).
package sqlscan

package lockhooks

import (
	"net/url"
	"strconv"
	"strings"
)

// sqliteDSN is what lockhooks reads from an SQLite DSN: the parsed
// parameters that decide which connection defaults it may apply and how it
// begins write transactions. It follows modernc.org/sqlite's parsing (the
// query is everything after the first '?' past the first byte; keys are
// case-sensitive, pragma names are not), plus the SQLite URI parameters
// mode and immutable. Nothing is decided by searching the DSN's text.
type sqliteDSN struct {
	// known is false when lockhooks has no DSN (a wrapped connector) or
	// cannot parse its query (the driver then refuses it at Connect).
	known bool

	// The settings the DSN makes itself; lockhooks' defaults leave them alone.
	busyTimeout bool // _pragma=busy_timeout(…), _busy_timeout, _timeout
	journalMode bool // _pragma=journal_mode(…), _journal_mode, _journal
	foreignKeys bool // _pragma=foreign_keys(…), _foreign_keys, _fk

	// readOnly names the parameter that makes the open read-only
	// ("mode=ro", "immutable=1", "query_only"), or is "".
	readOnly string

	// txlock is _txlock, lower-cased: "", "deferred", "immediate" or
	// "exclusive"; txlockGiven says the key is present (even empty).
	txlock      string
	txlockGiven bool

	// driverBegins is set when the DSN makes the inner driver's own
	// BeginTx begin a write transaction as lockhooks must (modernc with
	// _txlock=immediate, or exclusive), so lockhooks takes the writer lock
	// and calls it instead of running BEGIN and COMMIT itself;
	// setBeginMode is set when lockhooks tells each modernc connection to
	// begin IMMEDIATE itself because the DSN leaves _txlock unset. See
	// planModerncBegin.
	driverBegins bool
	setBeginMode bool
}

// parseSQLiteDSN parses dsn as modernc.org/sqlite does (mattn/go-sqlite3
// uses the same keys). dsn "" (a connector) gives a zero, unknown result.
func parseSQLiteDSN(dsn string) sqliteDSN {
	var d sqliteDSN
	if dsn == "" {
		return d
	}
	query := ""
	if pos := strings.IndexByte(dsn, '?'); pos >= 1 {
		query = dsn[pos+1:]
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return d
	}
	d.known = true

	// The shorthand keys, with the precedence modernc gives them: the alias
	// wins over the primary key, and an empty value sets nothing.
	pick := func(primary, alias string) bool {
		v, ok := "", false
		if _, in := q[primary]; in {
			v, ok = q.Get(primary), true
		}
		if _, in := q[alias]; in {
			v, ok = q.Get(alias), true
		}
		return ok && v != ""
	}
	d.busyTimeout = pick("_busy_timeout", "_timeout")
	d.journalMode = pick("_journal_mode", "_journal")
	d.foreignKeys = pick("_foreign_keys", "_fk")
	if v := q.Get("_query_only"); v != "" && sqliteTrue(v) {
		d.readOnly = "_query_only"
	}

	for _, p := range q["_pragma"] {
		name, value := splitPragma(p)
		switch name {
		case "busy_timeout":
			d.busyTimeout = true
		case "journal_mode":
			d.journalMode = true
		case "foreign_keys":
			d.foreignKeys = true
		case "query_only":
			// Any query_only that is on counts, whatever its order: a
			// read-only open is the one case where doing less is safe.
			if value != "" && sqliteTrue(value) {
				d.readOnly = "_pragma=query_only"
			}
		}
	}

	// SQLite URI parameters (names and values as SQLite compares them). A
	// DSN that is not a file: URI does not pass them to SQLite, but a
	// user who wrote mode=ro asked for no writes, so lockhooks makes none.
	if q.Get("mode") == "ro" {
		d.readOnly = "mode=ro"
	} else if v := q.Get("immutable"); v != "" && sqliteTrue(v) {
		d.readOnly = "immutable=1"
	}

	d.txlock = strings.ToLower(q.Get("_txlock"))
	_, d.txlockGiven = q["_txlock"]
	return d
}

// planModerncBegin decides who begins the write transactions of a
// database opened with d through modernc.org/sqlite (inner is its driver or
// connector). modernc begins a transaction that is not read-only with
// "BEGIN <_txlock>" and a read-only one deferred, which is lockhooks' rule,
// its COMMIT waits only as long as BeginTx's context allows, as lockhooks'
// own does, and its BEGIN and COMMIT take an internal path that is cheaper
// than running them as statements. So where the DSN says _txlock=immediate
// or exclusive the driver begins (driverBegins), and where it leaves
// _txlock unset on an open that is not read-only lockhooks tells each new
// connection to begin IMMEDIATE, as _txlock=immediate would, without
// changing the DSN the driver and its connection hooks see (setBeginMode;
// see beginModerncImmediate). Any other DSN leaves both false:
// _txlock=deferred (lockhooks still begins IMMEDIATE), an empty _txlock
// and another driver's DSN make lockhooks run BEGIN IMMEDIATE itself; on a
// read-only open every transaction begins as the driver begins it.
func (d *sqliteDSN) planModerncBegin(inner any) {
	if !d.known || packageOf(inner) != moderncPackage {
		return
	}
	d.driverBegins = d.txlockBeginsWrites()
	d.setBeginMode = d.readOnly == "" && !d.txlockGiven
}

// txlockBeginsWrites reports whether modernc, opened with d, begins write
// transactions as lockhooks must by itself: _txlock=immediate or
// exclusive, on an open that is not read-only.
func (d *sqliteDSN) txlockBeginsWrites() bool {
	return d.readOnly == "" && (d.txlock == "immediate" || d.txlock == "exclusive")
}

// splitPragma splits a _pragma value such as "busy_timeout(5000)",
// "journal_mode = WAL" or "main.foreign_keys(1)" into its lower-cased name,
// without a schema, and its value, without quotes ("" when the pragma is a
// query).
func splitPragma(p string) (name, value string) {
	p = strings.TrimSpace(p)
	end := strings.IndexAny(p, "(= \t")
	if end < 0 {
		end = len(p)
	}
	name, rest := strings.ToLower(p[:end]), strings.TrimSpace(p[end:])
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	switch {
	case strings.HasPrefix(rest, "("):
		value = strings.TrimSuffix(strings.TrimSpace(rest[1:]), ")")
	case strings.HasPrefix(rest, "="):
		value = rest[1:]
	}
	value = strings.Trim(strings.TrimSpace(value), `'"`)
	return name, value
}

// sqliteTrue reports whether v is true as SQLite reads a boolean pragma or
// URI parameter: on, yes, true, or a non-zero integer.
func sqliteTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on", "yes", "true":
		return true
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return err == nil && n != 0
}

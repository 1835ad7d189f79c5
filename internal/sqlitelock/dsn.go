package sqlitelock

import (
	"net/url"
	"strconv"
	"strings"
)

// DSN is what lockhooks reads from an SQLite DSN: the parsed
// parameters that decide which connection defaults it may apply and how it
// begins write transactions. It follows modernc.org/sqlite's parsing (the
// query is everything after the first '?' past the first byte; keys are
// case-sensitive, pragma names are not), plus the SQLite URI parameters
// mode and immutable. Nothing is decided by searching the DSN's text.
type DSN struct {
	// Known is false when lockhooks has no DSN (a wrapped connector) or
	// cannot parse its query (the driver then refuses it at Connect).
	Known bool

	// The settings the DSN makes itself; lockhooks' defaults leave them alone.
	BusyTimeout bool // _pragma=busy_timeout(…), _busy_timeout, _timeout
	JournalMode bool // _pragma=journal_mode(…), _journal_mode, _journal
	ForeignKeys bool // _pragma=foreign_keys(…), _foreign_keys, _fk

	// ReadOnly names the parameter that makes the open read-only
	// ("mode=ro", "immutable=1", "query_only"), or is "".
	ReadOnly string

	// TxLock is _txlock, lower-cased: "", "deferred", "immediate" or
	// "exclusive"; TxLockGiven says the key is present (even empty).
	TxLock      string
	TxLockGiven bool

	// DriverBegins is set when the DSN makes the inner driver's own
	// BeginTx begin a write transaction as lockhooks must (modernc with
	// _txlock=immediate, or exclusive), so lockhooks takes the writer lock
	// and calls it instead of running BEGIN and COMMIT itself;
	// SetBeginMode is set when lockhooks tells each modernc connection to
	// begin IMMEDIATE itself because the DSN leaves _txlock unset. See
	// PlanModerncBegin.
	DriverBegins bool
	SetBeginMode bool
}

// ParseDSN parses dsn as modernc.org/sqlite does (mattn/go-sqlite3
// uses the same keys). dsn "" (a connector) gives a zero, unknown result.
func ParseDSN(dsn string) DSN {
	var d DSN
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
	d.Known = true

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
	d.BusyTimeout = pick("_busy_timeout", "_timeout")
	d.JournalMode = pick("_journal_mode", "_journal")
	d.ForeignKeys = pick("_foreign_keys", "_fk")
	if v := q.Get("_query_only"); v != "" && SQLiteTrue(v) {
		d.ReadOnly = "_query_only"
	}

	for _, p := range q["_pragma"] {
		name, value := SplitPragma(p)
		switch name {
		case "busy_timeout":
			d.BusyTimeout = true
		case "journal_mode":
			d.JournalMode = true
		case "foreign_keys":
			d.ForeignKeys = true
		case "query_only":
			// Any query_only that is on counts, whatever its order: a
			// read-only open is the one case where doing less is safe.
			if value != "" && SQLiteTrue(value) {
				d.ReadOnly = "_pragma=query_only"
			}
		}
	}

	// SQLite URI parameters (names and values as SQLite compares them). A
	// DSN that is not a file: URI does not pass them to SQLite, but a
	// user who wrote mode=ro asked for no writes, so lockhooks makes none.
	if q.Get("mode") == "ro" {
		d.ReadOnly = "mode=ro"
	} else if v := q.Get("immutable"); v != "" && SQLiteTrue(v) {
		d.ReadOnly = "immutable=1"
	}

	d.TxLock = strings.ToLower(q.Get("_txlock"))
	_, d.TxLockGiven = q["_txlock"]
	return d
}

// PlanModerncBegin decides who begins the write transactions of a
// database opened with d through modernc.org/sqlite (innerPackage is the
// import path of the package of its driver or connector). modernc begins a transaction that is not read-only with
// "BEGIN <_txlock>" and a read-only one deferred, which is lockhooks' rule,
// its COMMIT waits only as long as BeginTx's context allows, as lockhooks'
// own does, and its BEGIN and COMMIT take an internal path that is cheaper
// than running them as statements. So where the DSN says _txlock=immediate
// or exclusive the driver begins (driverBegins), and where it leaves
// _txlock unset on an open that is not read-only lockhooks tells each new
// connection to begin IMMEDIATE, as _txlock=immediate would, without
// changing the DSN the driver and its connection hooks see (setBeginMode;
// see BeginModerncImmediate). Any other DSN leaves both false:
// _txlock=deferred (lockhooks still begins IMMEDIATE), an empty _txlock
// and another driver's DSN make lockhooks run BEGIN IMMEDIATE itself; on a
// read-only open every transaction begins as the driver begins it.
func (d *DSN) PlanModerncBegin(innerPackage string) {
	if !d.Known || innerPackage != ModerncPackage {
		return
	}
	d.DriverBegins = d.TxLockBeginsWrites()
	d.SetBeginMode = d.ReadOnly == "" && !d.TxLockGiven
}

// TxLockBeginsWrites reports whether modernc, opened with d, begins write
// transactions as lockhooks must by itself: _txlock=immediate or
// exclusive, on an open that is not read-only.
func (d *DSN) TxLockBeginsWrites() bool {
	return d.ReadOnly == "" && (d.TxLock == "immediate" || d.TxLock == "exclusive")
}

// SplitPragma splits a _pragma value such as "busy_timeout(5000)",
// "journal_mode = WAL" or "main.foreign_keys(1)" into its lower-cased name,
// without a schema, and its value, without quotes ("" when the pragma is a
// query).
func SplitPragma(p string) (name, value string) {
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

// SQLiteTrue reports whether v is true as SQLite reads a boolean pragma or
// URI parameter: on, yes, true, or a non-zero integer.
func SQLiteTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on", "yes", "true":
		return true
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return err == nil && n != 0
}

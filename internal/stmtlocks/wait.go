package stmtlocks

import (
	"database/sql/driver"
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Key is an advisory key as the caller keys its locks: [advisorykey.Key],
// or a type defined over it that names a key for a reader (String).
type Key = advisorykey.Named

// AdvisoryWait is what the lock wait of a statement's advisory calls is,
// as spans and the page name it: the mode and scope of its first call
// that takes a lock, the keys of those calls as text ("expression" for
// one not known before the statement runs), and the known keys among
// them (for a single call, keys itself, capped: no allocation). keys and
// known are the key of each call, where known. ok is false
// for a statement that takes no lock (only unlocks): it has no wait.
func AdvisoryWait[K Key](adv *sqlscan.Advisory, keys []K, known []bool) (mode, scope, text string, resolved []K, ok bool) {
	var acquire *sqlscan.AdvisoryCall
	var names []string
	for i, call := range adv.Calls {
		if call.Func&(sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 {
			continue
		}
		if acquire == nil {
			acquire = &adv.Calls[i]
		}
		switch {
		case !known[i]:
			names = append(names, "expression")
		case len(adv.Calls) == 1:
			names, resolved = append(names, keys[0].String()), keys[:1:1] // (no allocation)
		default:
			names, resolved = append(names, keys[i].String()), append(resolved, keys[i])
		}
	}
	if acquire == nil {
		return "", "", "", nil, false
	}
	mode, scope = "exclusive", "session"
	if acquire.Func&sqlscan.FnShared != 0 {
		mode = "shared"
	}
	if acquire.Func&sqlscan.FnXact != 0 {
		scope = "transaction"
	}
	return mode, scope, strings.Join(names, ", "), resolved, true
}

// Waiting returns the known keys of a statement's calls that wait
// (pg_advisory_lock and pg_advisory_xact_lock, shared or not). keys and
// known are the key of each call, where known.
func Waiting[K any](adv *sqlscan.Advisory, keys []K, known []bool) []K {
	waits := func(i int) bool {
		return adv.Calls[i].Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll) == 0 && known[i]
	}
	if len(adv.Calls) == 1 { // the usual statement: no allocation
		if waits(0) {
			return keys[:1:1]
		}
		return nil
	}
	var out []K
	for i := range adv.Calls {
		if waits(i) {
			out = append(out, keys[i])
		}
	}
	return out
}

// RowLockMode is the mode of a row-locking statement's wait, as spans and
// the page name it: its strongest clause, FOR UPDATE counted as FOR NO
// KEY UPDATE where lockhooks rewrote it.
func RowLockMode(locks sqlscan.LockInfo, rewrote bool) string {
	switch {
	case locks&sqlscan.ForUpdate != 0 && !rewrote:
		return "for_update"
	case locks&(sqlscan.ForUpdate|sqlscan.ForNoKeyUpdate) != 0:
		return "for_no_key_update"
	case locks&sqlscan.ForShare != 0:
		return "for_share"
	}
	return "for_key_share"
}

// OneSessionLock reports whether a statement is nothing but one call of
// pg_advisory_lock or pg_try_advisory_lock (exclusive, session level):
// the statements whose key may take its turn in the in-process queue.
func OneSessionLock(adv *sqlscan.Advisory) bool {
	return adv != nil && adv.Simple && adv.Calls[0].Func&^sqlscan.FnTry == 0
}

// IntegerArgs reports whether every argument is a value of one of Go's
// integer types that fits an int64: sent as text with its type left to
// the server (pgx's QueryExecModeExec, which an annotated lock statement
// runs in), such a value means what it meant in the driver's own mode,
// where a []byte, a time.Time or a value of the driver's own types need
// not.
func IntegerArgs(args []driver.NamedValue) bool {
	for _, a := range args {
		if _, isInt, fits := lockset.IntegerValue(a.Value); !isInt || !fits {
			return false
		}
	}
	return true
}

package pgserver

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// What a deadlock's DETAIL and CONTEXT name, in the words of a reader:
// the lock each side waited for or held, and advice that fits the
// pattern.

var (
	relationRE = regexp.MustCompile(`^relation (\d+) of database \d+$`)
	tupleRE    = regexp.MustCompile(`^tuple \((\d+,\d+)\) of relation (\d+) of database \d+$`)
	advisoryRE = regexp.MustCompile(`^advisory lock \[\d+,(\d+),(\d+),([12])\]$`)
	txRE       = regexp.MustCompile(`^transaction (\d+)$`)
	whereRowRE = regexp.MustCompile(`while (\w+) tuple \((\d+,\d+)\) in relation "([^"]+)"`)
)

// DescribeTarget names the lock edge e waits for, as its waiter waits for
// it, or (held) as its holder holds it: relations by the names f read,
// advisory keys as key formats them (which may add the name a key was
// made from).
func DescribeTarget(e DeadlockEdge, f DeadlockFacts, held bool, key func(advisorykey.Key) string) string {
	t := e.Target
	rel := func(oid string) string {
		if name := f.Relations[oid]; name != "" {
			return name
		}
		return "relation " + oid
	}
	switch {
	case txRE.MatchString(t) && held:
		return fmt.Sprintf("rows its transaction locked or changed (%s)", t)
	case txRE.MatchString(t):
		return fmt.Sprintf("a row backend %d's transaction locked or changed (%s on %s)", e.By, e.Mode, t)
	case tupleRE.MatchString(t):
		m := tupleRE.FindStringSubmatch(t)
		return fmt.Sprintf("row (%s) of %s (%s)", m[1], rel(m[2]), e.Mode)
	case relationRE.MatchString(t):
		return fmt.Sprintf("table %s (%s)", rel(relationRE.FindStringSubmatch(t)[1]), e.Mode)
	case advisoryRE.MatchString(t):
		m := advisoryRE.FindStringSubmatch(t)
		hi, _ := strconv.ParseInt(m[1], 10, 64)
		lo, _ := strconv.ParseInt(m[2], 10, 64)
		k := advisorykey.Key{K1: hi<<32 | lo}
		if m[3] == "2" {
			k = advisorykey.Key{Pair: true, K1: hi, K2: lo}
		}
		k.Shared = e.Mode == "ShareLock"
		return "advisory key " + key(k)
	}
	return e.Mode + " on " + t
}

// DescribeRowWait names the row the victim's statement waited for, from
// the error's CONTEXT (where), when where names one and e (the victim's
// edge) waits for a transaction: "row (0,2) of parent (locking it), which
// backend 902's transaction locked or changed (ShareLock on transaction
// 1234)".
func DescribeRowWait(e DeadlockEdge, where string) (string, bool) {
	m := whereRowRE.FindStringSubmatch(where)
	if m == nil || !txRE.MatchString(e.Target) {
		return "", false
	}
	return fmt.Sprintf("row (%s) of %s (%s it), which backend %d's transaction locked or changed (%s on %s)", m[2], m[3], m[1], e.By, e.Mode, e.Target), true
}

// DeadlockAdvice says what to change for the deadlock's pattern, from what
// the victim held (held, as lockhooks named its locks), the statements of
// the other sides (others), the error's CONTEXT (where) and the cycle's
// edges.
func DeadlockAdvice(held, others []string, where string, edges []DeadlockEdge) string {
	const retry = "retry the transaction (lockhooks.RunInTx does)"
	keptForUpdate := false
	for _, h := range held {
		keptForUpdate = keptForUpdate || strings.HasSuffix(h, "(FOR UPDATE)")
	}
	otherWrites := false
	for _, s := range others {
		w := strings.ToUpper(strings.TrimSpace(s))
		otherWrites = otherWrites || strings.HasPrefix(w, "INSERT") || strings.HasPrefix(w, "UPDATE")
	}
	advisory, rows, tables := false, false, false
	for _, e := range edges {
		switch {
		case strings.HasPrefix(e.Target, "advisory"):
			advisory = true
		case strings.HasPrefix(e.Target, "relation"):
			tables = true
		default:
			rows = true
		}
	}
	switch {
	case strings.Contains(where, "FOR KEY SHARE OF"), keptForUpdate && otherWrites && rows:
		return "a foreign-key check (FOR KEY SHARE on the parent row, taken by INSERT or UPDATE of a child row) met a parent row locked FOR UPDATE: lock parent rows FOR NO KEY UPDATE, which foreign-key checks pass (lockhooks' rewrite, on by default: drop lockhooks.KeepForUpdate, the keep-for-update comment or WithKeyShareRewrite(false) for this statement), unless the row is deleted or its key changed; " + retry
	case advisory && !rows && !tables:
		return "two transactions took advisory keys in opposite orders: take them in one order everywhere (lockhooks.Lock sorts its ids; lockhooks.WithLockOrderCheck finds where the order differs); " + retry
	case rows && !tables:
		return "two transactions locked the same rows in opposite orders: lock rows in one order everywhere (ORDER BY the key in SELECT … FOR UPDATE, sort the ids before updating, or lockhooks.Lock them first); lockhooks.WithLockOrderCheck finds where the order differs; " + retry
	}
	return "take these locks in one order everywhere (lockhooks.WithLockOrderCheck finds where they are not); " + retry
}

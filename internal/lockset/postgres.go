package lockset

import (
	"slices"
	"strconv"
	"strings"
)

// AdvisoryKeys maps (namespace, id) to Postgres advisory keys, sorted and
// without duplicates: key(namespace + "\x00" + id) for each canonical id
// (lockhooks passes LockID, which also remembers the name for messages).
func AdvisoryKeys(namespace string, ids []string, key func(name string) int64) []int64 {
	out := make([]int64, len(ids))
	for i, k := range ids {
		out[i] = key(namespace + "\x00" + k)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// maxTargetCalls bounds the calls Statement writes as a target list:
// Postgres refuses a target list of more than 1664 entries (54011).
const maxTargetCalls = 1000

// Statement returns the statement that calls fn on each key, in order: a
// target list "SELECT fn(k1), fn(k2), …" (one column per key), or, for more
// keys than a target list may have, "SELECT agg(fn(k)) FROM unnest(…) k"
// (one column; unnest yields the keys in order, and the aggregate's
// argument is evaluated row by row as they come, so the locks are taken in
// the same order).
func Statement(fn, agg string, keys []int64) string {
	if len(keys) <= maxTargetCalls {
		return "SELECT " + Calls(fn, keys)
	}
	var b strings.Builder
	b.WriteString("SELECT " + agg + "(" + fn + "(k)) FROM unnest('{")
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(k, 10))
	}
	b.WriteString("}'::bigint[]) AS k")
	return b.String()
}

// Calls returns "fn(k1), fn(k2), …".
func Calls(fn string, keys []int64) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fn + "(" + strconv.FormatInt(k, 10) + ")"
	}
	return strings.Join(parts, ", ")
}

package pgserver

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// AppendOwnLocksQuery appends the text of a pg_locks read of backend pid's
// granted advisory locks (0: of the backend that answers) to b: from is
// what the read selects from (a one-row subquery), suffix ends it.
//
// The read returns one row of one text column, whatever the backend holds
// (ParseOwnLocks reads it): "<pid>[ <classid> <objid> <objsubid><x|s>]…|<marker>",
// the backend that answers, its granted advisory locks (x: ExclusiveLock,
// s: ShareLock) and its session marker ("" when it has none). One column
// of one row is what a driver reads at the least cost: pgx allocates per
// column of a result and per value of a row.
func AppendOwnLocksQuery[T string | []byte](b []byte, from T, pid int32, suffix string) []byte {
	b = append(b, `SELECT pg_backend_pid() || coalesce((SELECT string_agg(' ' || l.classid || ' ' || l.objid || ' ' || l.objsubid || CASE WHEN l.mode = 'ShareLock' THEN 's' ELSE 'x' END, '') FROM pg_locks l WHERE l.pid = `...)
	if pid != 0 {
		b = strconv.AppendInt(b, int64(pid), 10)
	} else {
		b = append(b, "pg_backend_pid()"...)
	}
	b = append(b, ` AND l.locktype = 'advisory' AND l.granted), '') || '|' || coalesce(current_setting('lockhooks.session', true), '')
FROM `...)
	b = append(b, from...)
	return append(b, suffix...)
}

// ParseOwnLocks reads the row of a read made by AppendOwnLocksQuery,
// calling held with each advisory lock it names, in the row's order (a
// lock may be named more than once: the caller keeps each once), and
// returns the backend that answered and its session marker.
func ParseOwnLocks(row string, held func(advisorykey.Key)) (ranOn int32, marker string, err error) {
	head, marker, ok := strings.Cut(row, "|")
	if !ok {
		return 0, "", fmt.Errorf("lockhooks: the pg_locks read returned %q, not <pid> <locks>|<marker>", row)
	}
	next := func() (int64, string, bool) {
		head = strings.TrimPrefix(head, " ")
		i := strings.IndexByte(head, ' ')
		if i < 0 {
			i = len(head)
		}
		field := head[:i]
		head = head[i:]
		var mode string
		if n := len(field); n > 0 && (field[n-1] == 'x' || field[n-1] == 's') {
			field, mode = field[:n-1], field[n-1:]
		}
		v, err := strconv.ParseInt(field, 10, 64)
		return v, mode, err == nil
	}
	pid, _, ok := next()
	for ok && head != "" {
		classid, _, ok1 := next()
		objid, _, ok2 := next()
		objsubid, mode, ok3 := next()
		if ok = ok1 && ok2 && ok3 && mode != ""; !ok {
			break
		}
		held(advisorykey.FromLocks(classid, objid, objsubid, mode == "s"))
	}
	if !ok {
		return 0, "", fmt.Errorf("lockhooks: the pg_locks read returned %q, not <pid> <locks>|<marker>", row)
	}
	return int32(pid), marker, nil
}

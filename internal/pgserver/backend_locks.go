package pgserver

import (
	"database/sql/driver"
	"io"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// BackendLocks is what a read made by BackendLocksQuery found: of the
// backends it asked about, which are alive and which advisory locks each
// was granted, and the backend the read ran on (its pid and session
// marker).
type BackendLocks struct {
	Alive  map[int32]bool
	Held   map[int32]map[advisorykey.Key]bool
	RanOn  int32
	Marker string
}

// Holds reports whether backend pid held k when it was read.
func (b BackendLocks) Holds(pid int32, k advisorykey.Key) bool { return b.Held[pid][k] }

// BackendLocksQuery is the read, in one statement, of whether the
// backends pids are alive and which advisory locks they were granted,
// with the pid and session marker of the backend that answers it (a row
// even when none of them is alive).
func BackendLocksQuery(pids []int32) string {
	where := "false"
	if len(pids) > 0 {
		list := make([]string, len(pids))
		for i, pid := range pids {
			list[i] = strconv.Itoa(int(pid))
		}
		where = "a.pid IN (" + strings.Join(list, ",") + ")"
	}
	return `SELECT me.pid, me.marker, a.pid, l.classid::bigint, l.objid::bigint, l.objsubid::int, l.mode
FROM (SELECT pg_backend_pid() AS pid, current_setting('lockhooks.session', true) AS marker) me
LEFT JOIN pg_stat_activity a ON ` + where + `
LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted`
}

// ReadBackendLocks reads the rows of BackendLocksQuery; on an error it
// returns what it read before it.
func ReadBackendLocks(rows driver.Rows) (b BackendLocks, err error) {
	b.Alive, b.Held = map[int32]bool{}, map[int32]map[advisorykey.Key]bool{}
	dest := make([]driver.Value, 7)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return b, nil
			}
			return b, err
		}
		b.RanOn, b.Marker = int32(pgdriver.AsInt64(dest[0])), pgdriver.AsString(dest[1])
		if dest[2] == nil {
			continue
		}
		pid := int32(pgdriver.AsInt64(dest[2]))
		b.Alive[pid] = true
		if dest[3] == nil {
			continue
		}
		if b.Held[pid] == nil {
			b.Held[pid] = map[advisorykey.Key]bool{}
		}
		k := advisorykey.FromLocks(pgdriver.AsInt64(dest[3]), pgdriver.AsInt64(dest[4]), pgdriver.AsInt64(dest[5]), dest[6] == "ShareLock")
		b.Held[pid][k] = true
	}
}

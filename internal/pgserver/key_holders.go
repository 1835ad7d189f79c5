package pgserver

import (
	"database/sql/driver"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// KeyHoldersQuery is the read of the backends other than except that hold
// any of keys now (an exclusive holder only, for a shared key: only it
// blocks a shared request), in this database; keys is not empty.
func KeyHoldersQuery(keys []advisorykey.Key, except int32) string {
	var match []string
	for _, k := range keys {
		classid, objid, sub := k.LocksID()
		m := fmt.Sprintf("(l.classid::bigint = %d AND l.objid::bigint = %d AND l.objsubid = %d", classid, objid, sub)
		if k.Shared {
			m += " AND l.mode = 'ExclusiveLock'" // only exclusive holders block a shared request
		}
		match = append(match, m+")")
	}
	return `SELECT DISTINCT a.pid::bigint, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1), left(coalesce(a.query, ''), 1000),
	coalesce(extract(epoch FROM clock_timestamp() - a.state_change)::float8, -1)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.pid <> ` + strconv.Itoa(int(except)) + ` AND (` + strings.Join(match, " OR ") + `)
ORDER BY 1`
}

// ReadKeyHolders reads the rows of KeyHoldersQuery and closes them: each
// holder as a blocker at depth 1, seen by seenBy; nil with the error of a
// failed read.
func ReadKeyHolders(rows driver.Rows, seenBy any) ([]holders.Blocker, error) {
	defer rows.Close()
	var out []holders.Blocker
	dest := make([]driver.Value, 6)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return nil, err
		}
		out = append(out, holders.Blocker{SeenBy: seenBy, Depth: 1, PID: int32(pgdriver.AsInt64(dest[0])), ApplicationName: pgdriver.AsString(dest[1]),
			State: pgdriver.AsString(dest[2]), XactSeconds: pgdriver.AsFloat64(dest[3]), Query: pgdriver.AsString(dest[4]), StateSeconds: pgdriver.AsFloat64(dest[5])})
	}
}

package pgserver

import (
	"database/sql/driver"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// A DeadlockEdge is one line of a deadlock's DETAIL: "Process PID waits
// for Mode on Target; blocked by process By."
type DeadlockEdge struct {
	PID, By int32
	Mode    string // the lock mode waited for, e.g. ShareLock
	Target  string // what it waited for: "transaction 1234", "tuple (0,1) of relation 16384 of database 5", "advisory lock [5,0,7,1]", …
}

var (
	deadlockLineRE = regexp.MustCompile(`Process (\d+) waits for (\w+) on (.+?); blocked by process (\d+)\.`)
	relOIDRE       = regexp.MustCompile(`relation (\d+) of database`)
)

// ParseDeadlockDetail reads the wait-for edges of a deadlock's DETAIL.
func ParseDeadlockDetail(detail string) []DeadlockEdge {
	var out []DeadlockEdge
	for _, m := range deadlockLineRE.FindAllStringSubmatch(detail, -1) {
		pid, _ := strconv.ParseInt(m[1], 10, 32)
		by, _ := strconv.ParseInt(m[4], 10, 32)
		out = append(out, DeadlockEdge{PID: int32(pid), By: int32(by), Mode: m[2], Target: m[3]})
	}
	return out
}

// DeadlockFacts is what a read after a deadlock found about its cycle:
// each backend's pg_stat_activity row, and the names of the relations the
// DETAIL names by oid.
type DeadlockFacts struct {
	Backends  map[int32]BackendFacts
	Relations map[string]string // oid → name
	Err       error             // the read's failure, if it failed
}

// BackendFacts is what pg_stat_activity showed of one backend of a
// deadlock's cycle.
type BackendFacts struct {
	App       string  // application_name
	State     string  // state
	XactAge   float64 // seconds its transaction had run; < 0: no transaction
	Statement string  // its last statement (the one that waited), at most 500 bytes
}

// DeadlockFactsQuery is the read of the backends of edges and of the
// relations detail names by oid.
func DeadlockFactsQuery(edges []DeadlockEdge, detail string) string {
	var pids []string
	for _, e := range edges {
		pids = append(pids, strconv.Itoa(int(e.PID)))
	}
	oids := []string{"0"}
	for _, m := range relOIDRE.FindAllStringSubmatch(detail, -1) {
		oids = append(oids, m[1])
	}
	return `SELECT 'b', a.pid::text, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1)::text, left(coalesce(a.query, ''), 500)
FROM pg_stat_activity a WHERE a.pid IN (` + strings.Join(pids, ",") + `)
UNION ALL
SELECT 'r', c.oid::text, c.oid::regclass::text, '', '', '' FROM pg_class c WHERE c.oid IN (` + strings.Join(oids, ",") + `)`
}

// ReadDeadlockFacts reads the rows of DeadlockFactsQuery into f's maps
// (made if nil) and closes them.
func ReadDeadlockFacts(rows driver.Rows, f *DeadlockFacts) error {
	defer rows.Close()
	if f.Backends == nil {
		f.Backends = map[int32]BackendFacts{}
	}
	if f.Relations == nil {
		f.Relations = map[string]string{}
	}
	dest := make([]driver.Value, 6)
	for {
		if err := rows.Next(dest); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		switch pgdriver.AsString(dest[0]) {
		case "b":
			pid, _ := strconv.ParseInt(pgdriver.AsString(dest[1]), 10, 32)
			age, _ := strconv.ParseFloat(pgdriver.AsString(dest[4]), 64)
			f.Backends[int32(pid)] = BackendFacts{App: pgdriver.AsString(dest[2]), State: pgdriver.AsString(dest[3]), XactAge: age, Statement: pgdriver.AsString(dest[5])}
		case "r":
			f.Relations[pgdriver.AsString(dest[1])] = pgdriver.AsString(dest[2])
		}
	}
}

package lockhooks

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/identity"
)

// A chain of backends another process's identities name (their holders
// as internal/pgblocking makes them, tested there): a slow-wait line and
// an error name them like any other holder, with their process; the
// holders at the root come before those queued ahead.
func TestIdentityAsHolder(t *testing.T) {
	tx := &identity.Holder{Process: "web-1/4711", Database: 1, Pool: "jobs", Conn: 3, Holds: "tx", Site: "jobs/run.go:7"}

	// The chain: 8161 (another process) holds, 8170 (a third) waits for it
	// and blocks the waiter too, 8180 (no lockhooks) holds something else.
	app := func(id identity.Holder) string { return id.AppName() }
	b := &holders.Blockage{At: time.Now()}
	b.Add([]holders.Blocker{
		{PID: 8170, Depth: 1, Waiting: true, WaitSeconds: 2.1, State: "active", XactSeconds: 3, Query: "UPDATE t SET v = 2 WHERE id = 1",
			ApplicationName: app(identity.Holder{Process: "web-2/12", Database: 1, Conn: 5, Holds: "tx", Site: "jobs/b.go:9"})},
		{PID: 8161, Depth: 2, State: "idle in transaction", XactSeconds: 12.3, Query: "UPDATE t SET v = 1 WHERE id = 1", ApplicationName: app(*tx)},
		{PID: 8180, Depth: 1, State: "idle", XactSeconds: -1, ApplicationName: "psql", Query: "SELECT pg_advisory_lock(1)"},
	}, func(s holders.Blocker) (holders.Holder, bool) { return identify(s, nil) })
	line := b.String()
	for _, s := range []string{`connection #3 of "jobs" in process web-1/4711 (backend pid 8161), in a transaction begun at jobs/run.go:7, for 12.3`,
		`last statement "UPDATE t SET v = 1 WHERE id = 1"`, `backend pid 8180 ("psql"), idle`,
		"queued ahead of this wait, waiting too: connection #5 of database 1 in process web-2/12 (backend pid 8170), in a transaction begun at jobs/b.go:9, waiting 2.1s in \"UPDATE t SET v = 2 WHERE id = 1\""} {
		if !strings.Contains(line, s) {
			t.Errorf("%q does not say %q", line, s)
		}
	}
	if strings.Index(line, "8161") > strings.Index(line, "8170") {
		t.Errorf("the root holder is not named first: %s", line)
	}
	args := fmt.Sprintln(b.LogArgs()...)
	for _, s := range []string{"holder_process web-1/4711", "holder_pid 8161", "holder_site jobs/run.go:7", "blocking_pids 8180", "queued_pids 8170"} {
		if !strings.Contains(args, s) {
			t.Errorf("log attributes %q lack %q", args, s)
		}
	}
}

package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// Host and pid do not identify a process: two containers of one pod share
// the host name and both run as pid 1, and a restarted container has its
// predecessor's label. Another process with this process's host and pid
// (and so the same database and connection numbers) is told apart by the
// label's random nonce: its holder is named with the site it published,
// never as this process's own connection with that number. The other
// process is a plain connection publishing exactly what such a process's
// lockhooks would for its connection #1 holding a session lock.
func TestSameHostAndPidIsAnotherProcess(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	db, err := Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := db.Conn(ctx) // connection #1 of this database
	if err != nil {
		t.Fatal(err)
	}
	w := stateOf(t, c)
	c.Close()

	other, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	oc, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	label, nonce, _ := strings.Cut(identity.ProcessLabel(), ":")
	if len(nonce) != 4 {
		t.Fatalf("the process label %q has no nonce", identity.ProcessLabel())
	}
	otherLabel := label + ":" + strings.Map(func(r rune) rune { // another nonce
		if r == 'z' {
			return '0'
		}
		if r == '9' {
			return 'a'
		}
		return r + 1
	}, nonce)
	id := &identity.Holder{Process: otherLabel, Database: w.connector.seq, Conn: w.id, Holds: "lock", Site: "leader/elect.go:42", Since: time.Now()}
	mustExec(t, oc, "SET application_name = '"+id.AppName()+"'")
	mustExec(t, oc, "SELECT pg_advisory_lock(31337)")

	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = AcquireAdvisoryLock(wctx, db, 31337)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter: %v", err)
	}
	t.Log(err)
	if strings.Contains(err.Error(), "connection #1 of \""+w.connector.Pool+"\"") || !strings.Contains(err.Error(), "leader/elect.go:42") {
		t.Errorf("the other process's holder is named as this process's own connection #%d (and its published site is lost):\n%v", w.id, err)
	}
}

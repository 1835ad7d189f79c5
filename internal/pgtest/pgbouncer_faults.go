package pgtest

import (
	"context"
	"database/sql"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Faults a test injects into a PgBouncer of its own ([StartPooler]).

// Crash kills p with SIGKILL and waits for it to exit: the kernel closes
// every socket it had, to its clients and to the server, with nobody to say
// goodbye. The server's backends see their clients gone and exit. p stays
// down (its cleanup does nothing more).
func (p *Pooler) Crash(t testing.TB) {
	t.Helper()
	if p.proc == nil {
		t.Fatal("pgtest: Crash: PgBouncer is not running")
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("pgtest: SIGKILL to PgBouncer: %v", err)
	}
	select {
	case <-p.proc.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("pgtest: PgBouncer did not exit after SIGKILL")
	}
}

// Admin runs command (KILL db, RESUME db, PAUSE db, RECONNECT, …) on p's
// admin console.
func (p *Pooler) Admin(t testing.TB, command string) {
	t.Helper()
	// The admin console speaks only the simple query protocol.
	dsn := strings.Replace(p.dsnFor("pgbouncer"), "default_query_exec_mode=exec", "default_query_exec_mode=simple_protocol", 1)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, command); err != nil {
		t.Fatalf("pgtest: %s on PgBouncer's admin console: %v", command, err)
	}
}

package pgdriver

import (
	"database/sql/driver"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// pgx's stdlib connection runs lockhooks' own texts in the simple protocol
// when the first argument is pgx's QueryExecModeSimpleProtocol, found from
// the connection's type alone; pgx returns only the first statement's rows.
func TestStatementsOfPgx(t *testing.T) {
	var o Statements
	o.Of((*stdlib.Conn)(nil))
	if !o.OK() || !o.PGX || !o.IDFirst {
		t.Fatalf("pgx: OK %v, PGX %v, IDFirst %v; want all true", o.OK(), o.PGX, o.IDFirst)
	}
	if len(o.Args) != 1 || o.Args[0].Value != pgx.QueryExecModeSimpleProtocol {
		t.Errorf("simple-protocol argument %v, want %v", o.Args, pgx.QueryExecModeSimpleProtocol)
	}
	if len(o.Exec) != 1 || o.Exec[0].Value != pgx.QueryExecModeExec {
		t.Errorf("exec argument %v, want %v", o.Exec, pgx.QueryExecModeExec)
	}
	o.Disabled.Store(true)
	if o.OK() {
		t.Error("OK after Disabled")
	}
}

// Another driver's connection gets nothing: lockhooks then runs its
// statements as the driver runs any other.
func TestStatementsOfAnotherDriver(t *testing.T) {
	var o Statements
	o.Of(&otherConn{})
	if o.OK() || o.PGX || o.Args != nil {
		t.Errorf("another driver: %+v", &o)
	}
	if pid, ok := BackendKeyPID(&otherConn{}); ok {
		t.Errorf("BackendKeyPID of another driver = %d, true", pid)
	}
	if TxStatus(&otherConn{}) != nil || DefaultMode(&otherConn{}) != nil {
		t.Error("TxStatus or DefaultMode of another driver is not nil")
	}
}

type otherConn struct{ driver.Conn }

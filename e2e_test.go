package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"modernc.org/sqlite"
)

// openSQLite opens a fresh SQLite file through the wrapped modernc driver.
func openSQLite(t testing.TB, opts ...Option) *sql.DB {
	t.Helper()
	db, err := Open("sqlite", filepath.Join(t.TempDir(), "test.db"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// placeholder returns the n-th bind parameter in the dialect.
func placeholder(d Dialect, n int) string {
	if d == Postgres {
		return "$" + string(rune('0'+n))
	}
	return "?"
}

// exerciseCRUD runs ordinary database/sql work through db.
func exerciseCRUD(t *testing.T, db *sql.DB, d Dialect) {
	t.Helper()
	ctx := context.Background()
	p1, p2 := placeholder(d, 1), placeholder(d, 2)
	mustExec(t, db, "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
	res, err := db.ExecContext(ctx, "INSERT INTO items (id, name) VALUES ("+p1+", "+p2+")", 1, "one")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("insert affected %d rows", n)
	}

	var name string
	if err := db.QueryRowContext(ctx, "SELECT name FROM items WHERE id = "+p1, 1).Scan(&name); err != nil || name != "one" {
		t.Fatalf("QueryRow: %q, %v", name, err)
	}
	if err := db.QueryRowContext(ctx, "SELECT name FROM items WHERE id = "+p1, 99).Scan(&name); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("QueryRow of a missing row: %v, want sql.ErrNoRows", err)
	}

	// Transactions: a rollback leaves nothing, a commit keeps its write.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO items (id, name) VALUES (2, 'two')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO items (id, name) VALUES (3, 'three')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := countRows(t, db, "items"); got != 2 {
		t.Fatalf("after rollback and commit: %d rows, want 2", got)
	}

	// Prepared statements, executed several times.
	ins, err := db.PrepareContext(ctx, "INSERT INTO items (id, name) VALUES ("+p1+", "+p2+")")
	if err != nil {
		t.Fatal(err)
	}
	defer ins.Close()
	for i := 10; i < 13; i++ {
		if _, err := ins.ExecContext(ctx, i, "n"); err != nil {
			t.Fatal(err)
		}
	}
	sel, err := db.PrepareContext(ctx, "SELECT id FROM items WHERE id >= "+p1+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer sel.Close()
	rows, err := sel.QueryContext(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if !reflect.DeepEqual(ids, []int{10, 11, 12}) {
		t.Fatalf("prepared query returned %v", ids)
	}

	// A statement error is returned as the driver's error, and the
	// connection stays usable.
	if _, err := db.ExecContext(ctx, "INSERT INTO items (id, name) VALUES (1, 'dup')"); err == nil {
		t.Fatal("a duplicate key was accepted")
	}
	if got := countRows(t, db, "items"); got != 5 {
		t.Fatalf("%d rows, want 5", got)
	}

	// A context that is already cancelled stops the statement.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := db.ExecContext(cancelled, "SELECT 1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec with a cancelled context: %v", err)
	}
	if got := countRows(t, db, "items"); got != 5 {
		t.Fatalf("%d rows after a cancelled statement, want 5", got)
	}
}

func countRows(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPostgresEndToEnd(t *testing.T) {
	t.Run("sql.Open lockhooks+pgx", func(t *testing.T) {
		exerciseCRUD(t, openPG(t), Postgres)
	})
	t.Run("Open with options", func(t *testing.T) {
		exerciseCRUD(t, openPG(t, WithDialect(Postgres)), Postgres)
	})
	t.Run("OpenDB of a pgx connector", func(t *testing.T) {
		dsn := pgtest.DSN(t)
		c, err := stdlib.GetDefaultDriver().(driver.DriverContext).OpenConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		db := OpenDB(c)
		defer db.Close()
		exerciseCRUD(t, db, Postgres)
	})
}

func TestSQLiteEndToEnd(t *testing.T) {
	t.Run("Register", func(t *testing.T) {
		name, err := Register("sqlite")
		if err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open(name, filepath.Join(t.TempDir(), "r.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		exerciseCRUD(t, db, SQLite)
	})
	t.Run("Open", func(t *testing.T) {
		exerciseCRUD(t, openSQLite(t), SQLite)
	})
	t.Run("OpenDB of sqlite.NewConnector", func(t *testing.T) {
		c, err := sqlite.NewConnector(filepath.Join(t.TempDir(), "c.db"))
		if err != nil {
			t.Fatal(err)
		}
		db := OpenDB(c)
		defer db.Close()
		exerciseCRUD(t, db, SQLite)
	})
}

// sql.Conn.Raw hands out the wrapper; Unwrap reaches the driver's own conn,
// so driver-specific APIs keep working.
func TestRawReachesTheInnerConnection(t *testing.T) {
	ctx := context.Background()
	t.Run("pgx", func(t *testing.T) {
		conn, err := openPG(t).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		err = conn.Raw(func(dc any) error {
			inner, ok := dc.(interface{ Unwrap() driver.Conn }).Unwrap().(*stdlib.Conn)
			if !ok {
				return errors.New("Unwrap did not return *stdlib.Conn")
			}
			if inner.Conn().PgConn().PID() == 0 {
				return errors.New("no backend pid")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("modernc", func(t *testing.T) {
		conn, err := openSQLite(t).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// sqlite.Limit finds the driver's conn through Unwrap.
		if _, err := sqlite.Limit(conn, 0 /* SQLITE_LIMIT_LENGTH */, -1); err != nil {
			t.Fatal(err)
		}
	})
}

// On the real drivers the wrapper has the inner conn's optional interfaces,
// plus Validator.
func TestRealDriversKeepTheirInterfaces(t *testing.T) {
	ctx := context.Background()
	for name, db := range map[string]*sql.DB{"pgx": openPG(t), "modernc": openSQLite(t)} {
		t.Run(name, func(t *testing.T) {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.Raw(func(dc any) error {
				inner := dc.(connCore).Unwrap()
				want := implemented(inner, connOptional)
				if got := implemented(dc, connOptional); got != want {
					t.Errorf("wrapper implements %07b, inner %07b", got, want)
				}
				if _, ok := dc.(driver.Validator); !ok {
					t.Error("wrapper lacks Validator")
				}
				// Rows, when wrapped, keep theirs.
				innerRows, err := inner.(driver.QueryerContext).QueryContext(ctx, "SELECT 1 AS x", nil)
				if err != nil {
					return err
				}
				defer innerRows.Close()
				w := newRows(ctx, dc.(connCore).state(), innerRows, advisoryPlan{}, false)
				if got, want := implemented(w, rowsOptional), implemented(innerRows, rowsOptional); got != want || want == 0 {
					t.Errorf("wrapped rows implement %06b, inner %06b", got, want)
				}
				return nil
			})
			// Prepared statements keep theirs.
			conn.Raw(func(dc any) error {
				s, err := dc.(driver.ConnPrepareContext).PrepareContext(ctx, "SELECT 1")
				if err != nil {
					return err
				}
				defer s.Close()
				if got := implemented(s, stmtOptional); got&(stmtExecContextBit|stmtQueryContextBit) != stmtExecContextBit|stmtQueryContextBit {
					t.Errorf("wrapped stmt implements %04b, want the context forms", got)
				}
				return nil
			})
		})
	}
}

// A transaction cancelled by its context mid-statement leaves no dead
// connection in the pool: the wrapper's IsValid sees that pgx closed it.
func TestCancelledTransactionLeavesNoDeadConnection(t *testing.T) {
	db := openPG(t)
	db.SetMaxOpenConns(2)

	// Control: a healthy connection goes back to the pool.
	mustExec(t, db, "SELECT 1")
	if s := db.Stats(); s.Idle != 1 {
		t.Fatalf("after a good statement: %d idle connections, want 1", s.Idle)
	}

	ctx, cancel := context.WithCancel(context.Background())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := tx.ExecContext(ctx, "SELECT pg_sleep(60)")
		done <- err
	}()
	waitFor(t, 10*time.Second, "the statement to run", func() bool {
		var state string
		err := db.QueryRow("SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state)
		return err == nil && state == "active"
	})
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled statement succeeded")
	}
	// database/sql rolls back in the background; wait until the connection
	// is no longer in use.
	waitFor(t, 10*time.Second, "the transaction's connection to be released", func() bool {
		return db.Stats().InUse == 0
	})
	if s := db.Stats(); s.Idle != 1 || s.OpenConnections != 1 {
		t.Fatalf("after the cancelled transaction: open=%d idle=%d, want the one healthy connection only", s.OpenConnections, s.Idle)
	}
	if _, err := db.Query("SELECT 1"); err != nil {
		t.Fatalf("the next query failed: %v", err)
	}
	waitFor(t, 10*time.Second, "the cancelled backend to exit", func() bool {
		var n int
		return db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n) == nil && n == 0
	})
}

// The backend pid is read once, when the connection opens: the tracking,
// the monitor and every message name the backend by it.
func TestBackendPIDIsReadAtConnect(t *testing.T) {
	ctx := context.Background()
	conn, err := openPG(t).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var want int32
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&want); err != nil {
		t.Fatal(err)
	}
	conn.Raw(func(dc any) error {
		c := dc.(connCore).state()
		if got := c.pin.PID.Load(); got != want {
			t.Errorf("pid read at connect = %d, want %d", got, want)
		}
		for range 2 {
			got, err := c.BackendPID(ctx)
			if err != nil || got != want {
				t.Errorf("backendPID = %d, %v; want %d", got, err, want)
			}
		}
		if s := c.String(); !strings.Contains(s, fmt.Sprint(want)) {
			t.Errorf("String() = %q does not name the pid", s)
		}
		return nil
	})
}

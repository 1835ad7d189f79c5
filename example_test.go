package lockhooks_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"

	_ "github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/lockhooks/lockhooks"
)

// tempDB returns the path of a new SQLite file, and a function that
// removes it.
func tempDB() (string, func()) {
	dir, err := os.MkdirTemp("", "lockhooks-example-")
	if err != nil {
		log.Fatal(err)
	}
	return filepath.Join(dir, "app.db"), func() { os.RemoveAll(dir) }
}

// One SQL text for Postgres and SQLite: on SQLite the locking clause is
// removed; on Postgres FOR UPDATE is sent as FOR NO KEY UPDATE.
func ExampleOpen() {
	path, remove := tempDB()
	defer remove()
	db, err := lockhooks.Open("sqlite", path)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.Exec("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT)")
	db.Exec("INSERT INTO jobs VALUES (1, 'queued')")

	var state string
	err = db.QueryRow("SELECT state FROM jobs WHERE id = ? FOR UPDATE SKIP LOCKED", 1).Scan(&state)
	fmt.Println(state, err)
	// Output: queued <nil>
}

// Register wraps a driver under a new name; sql.Open then works unchanged.
func ExampleRegister() {
	name, err := lockhooks.Register("pgx") // "lockhooks+pgx"
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open(name, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
}

// OpenDB wraps a driver configured through its connector.
func ExampleOpenDB() {
	path, remove := tempDB()
	defer remove()
	c, err := sqlite.NewConnector(path)
	if err != nil {
		log.Fatal(err)
	}
	db := lockhooks.OpenDB(c)
	defer db.Close()
	fmt.Println(db.Ping())
	// Output: <nil>
}

// A transfer that locks both accounts, in one canonical order, until the
// transaction ends: no lost update, no "database is locked", no deadlock
// between two transfers in opposite directions.
func ExampleLock() {
	path, remove := tempDB()
	defer remove()
	db, err := lockhooks.Open("sqlite", path)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.Exec("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
	db.Exec("INSERT INTO accounts VALUES (1, 100), (2, 100)")

	ctx := context.Background()
	transfer := func(from, to, amount int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := lockhooks.Lock(ctx, tx, "accounts", from, to); err != nil {
			return err
		}
		if _, err := tx.Exec("UPDATE accounts SET balance = balance - ? WHERE id = ?", amount, from); err != nil {
			return err
		}
		if _, err := tx.Exec("UPDATE accounts SET balance = balance + ? WHERE id = ?", amount, to); err != nil {
			return err
		}
		return tx.Commit() // the locks are released after COMMIT returned
	}
	fmt.Println(transfer(1, 2, 30), transfer(2, 1, 10))
	var total int
	db.QueryRow("SELECT sum(balance) FROM accounts").Scan(&total)
	fmt.Println(total)
	// Output:
	// <nil> <nil>
	// 200
}

// A lock that spans several transactions, held on its own connection; the
// work stops if the lock is lost.
func ExampleAcquireAdvisoryLock() {
	path, remove := tempDB()
	defer remove()
	db, err := lockhooks.Open("sqlite", path) // on Postgres: a session advisory lock
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	l, err := lockhooks.AcquireAdvisoryLock(ctx, db, lockhooks.LockID("migrations"))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	select {
	case <-l.Lost():
		log.Fatal(l.Err()) // another replica may hold it now: stop
	default:
	}
	_, err = l.Conn().ExecContext(ctx, "CREATE TABLE schema_version (v INTEGER)")
	fmt.Println(err)
	// Output: <nil>
}

// KeepForUpdate keeps FOR UPDATE for a row that will be deleted, where
// FOR NO KEY UPDATE would not exclude foreign-key checks.
func ExampleKeepForUpdate() {
	db, err := lockhooks.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	tx.ExecContext(lockhooks.KeepForUpdate(ctx), "SELECT id FROM accounts WHERE id = $1 FOR UPDATE", 7)
	tx.ExecContext(ctx, "DELETE FROM accounts WHERE id = $1", 7)
	tx.Commit()
}

// sql.Conn.Raw reaches the driver's own connection with Unwrap. Calls on it
// bypass lockhooks, and on SQLite its writer lock: reading calls such as
// modernc's Serialize or NewBackup are safe beside lockhooks' writers;
// calls that write (statements run on it, NewRestore, Deserialize) meet or
// delay them as another process would. See the README's SQLite section.
func Example_unwrap() {
	path, remove := tempDB()
	defer remove()
	db, err := lockhooks.Open("sqlite", path)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.Exec("CREATE TABLE jobs (id INTEGER PRIMARY KEY)")

	conn, err := db.Conn(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		inner := dc.(interface{ Unwrap() driver.Conn }).Unwrap()
		image, err := inner.(interface{ Serialize() ([]byte, error) }).Serialize()
		fmt.Println("serialized:", len(image) > 0, err)
		return nil
	})
	fmt.Println(err)
	// Output:
	// serialized: true <nil>
	// <nil>
}

// A transfer run by RunInTx: each attempt is a fresh transaction, retried
// on deadlocks, serialization failures and SQLITE_BUSY with a jittered
// backoff; fn's own errors end it at once.
func ExampleRunInTx() {
	path, remove := tempDB()
	defer remove()
	db, err := lockhooks.Open("sqlite", path)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.Exec("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
	db.Exec("INSERT INTO accounts VALUES (1, 100), (2, 100)")

	ctx := context.Background()
	errInsufficient := errors.New("insufficient funds")
	transfer := func(from, to, amount int) error {
		return lockhooks.RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			if err := lockhooks.Lock(ctx, tx, "accounts", from, to); err != nil {
				return err
			}
			var balance int
			if err := tx.QueryRow("SELECT balance FROM accounts WHERE id = ?", from).Scan(&balance); err != nil {
				return err
			}
			if balance < amount {
				return errInsufficient // not retried
			}
			if _, err := tx.Exec("UPDATE accounts SET balance = balance - ? WHERE id = ?", amount, from); err != nil {
				return err
			}
			_, err := tx.Exec("UPDATE accounts SET balance = balance + ? WHERE id = ?", amount, to)
			return err
		}, lockhooks.MaxAttempts(5))
	}
	fmt.Println(transfer(1, 2, 30))
	err = transfer(2, 1, 500)
	fmt.Println(errors.Is(err, errInsufficient), err)
	// Output:
	// <nil>
	// true lockhooks: RunInTx attempt 1 failed: insufficient funds
}

// Two code paths that take the same two locks in opposite orders, run one
// after the other: they never deadlock here, and the checker still finds
// the cycle (its String also names the call sites of both orders).
func ExampleWithLockOrderCheck() {
	path, remove := tempDB()
	defer remove()
	db, err := lockhooks.Open("sqlite", path, lockhooks.WithLockOrderCheck(func(r lockhooks.LockOrderReport) {
		fmt.Println(r.Kind, r.Classes)
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	lockBoth := func(first, second string) error {
		return lockhooks.RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			if err := lockhooks.Lock(ctx, tx, first, 1); err != nil {
				return err
			}
			return lockhooks.Lock(ctx, tx, second, 1)
		})
	}
	fmt.Println(lockBoth("accounts", "jobs"))
	fmt.Println(lockBoth("jobs", "accounts"))
	// Output:
	// <nil>
	// lock-order cycle [lockset "jobs" lockset "accounts"]
	// <nil>
}

// DebugHandler shows who holds which lock and who waits for whom, as HTML
// or, with ?format=json, as JSON. Mount it behind your service's own
// authentication:
//
//	mux.Handle("/debug/locks", requireAdmin(lockhooks.DebugHandler(db)))
//
// Here the handler is called directly.
func ExampleDebugHandler() {
	path, remove := tempDB()
	defer remove()
	db, err := lockhooks.Open("sqlite", path)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	key := lockhooks.LockID("nightly-report")
	l, err := lockhooks.AcquireAdvisoryLock(ctx, db, key)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)

	rec := httptest.NewRecorder()
	lockhooks.DebugHandler(db).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/locks?format=json", nil))
	var page struct {
		Databases []struct {
			Held []struct {
				Kind, Scope, Key string
				Count            int
			}
			Waiters []json.RawMessage
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
		log.Fatal(err)
	}
	for _, h := range page.Databases[0].Held {
		fmt.Println(h.Kind, h.Scope, h.Key == fmt.Sprint(key), h.Count)
	}
	fmt.Println("waiting:", len(page.Databases[0].Waiters))
	// Output:
	// advisory session true 1
	// waiting: 0
}

package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// noTelemetry is telemetry with the global (no-op) providers.
var noTelemetry = newTelemetry(&options{}, "test", nil)

// openSQLiteFile opens one SQLite file through lockhooks; raw opens the
// same file through modernc as it is.
func openSQLiteFile(t testing.TB, opts ...Option) (wrapped *sql.DB, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "bank.db")
	db, err := Open("sqlite", path+"?_pragma=synchronous(NORMAL)", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

func beginTx(t testing.TB, db *sql.DB, opts *sql.TxOptions) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

var readOnly = &sql.TxOptions{ReadOnly: true}

type stringer string

func (s stringer) String() string { return string(s) }

func TestCanonicalIDOrder(t *testing.T) {
	uuidA, uuidB := [16]byte{1}, [16]byte{2}
	keys, err := canonicalIDs([]any{"b", uuidB, int64(10), -3, "a", uuidA, stringer("c"), uint8(2), 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, describeID(k))
	}
	want := `-3 2 10 "a" "b" "c" 01000000000000000000000000000000 02000000000000000000000000000000`
	if s := strings.Join(got, " "); s != want {
		t.Errorf("order %s\n want %s", s, want)
	}
	if _, err := canonicalIDs([]any{3.5}); err == nil || !strings.Contains(err.Error(), "float64") {
		t.Errorf("a float id: %v", err)
	}
	if _, err := canonicalIDs([]any{uint64(1) << 63}); err == nil || !strings.Contains(err.Error(), "does not fit an int64") {
		t.Errorf("an id too large for int64: %v", err)
	}
	if _, err := canonicalIDs(nil); err == nil {
		t.Error("no ids accepted")
	}
}

func TestLockTableLeavesNothingBehind(t *testing.T) {
	var table lockTable[int]
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 2))
			owner := fmt.Sprint("owner", w)
			for range 10000 / 8 {
				k := r.IntN(20)
				if r.IntN(2) == 0 {
					if table.tryLock(ctx, k, owner, nil, nil) {
						table.unlock(k, owner)
					}
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(50))*time.Microsecond)
				if table.lock(cctx, k, owner, nil, nil, nil) == nil {
					table.unlock(k, owner)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if n := table.size(); n != 0 {
		t.Errorf("%d entries left after all locks were released", n)
	}
	if table.unlock(1, "nobody") {
		t.Error("unlock by a non-holder succeeded")
	}
}

func TestLocksetBasics(t *testing.T) {
	db, _ := openSQLiteFile(t)
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")

	t.Run("re-entrant, released after commit", func(t *testing.T) {
		tx := beginTx(t, db, readOnly)
		if err := Lock(ctx, tx, "acct", 1, 2); err != nil {
			t.Fatal(err)
		}
		if err := Lock(ctx, tx, "acct", 2, 1); err != nil {
			t.Fatalf("re-entrant Lock: %v", err)
		}
		other := beginTx(t, db, readOnly)
		defer other.Rollback()
		if ok, err := TryLock(ctx, other, "acct", 1); ok || err != nil {
			t.Fatalf("TryLock of a held id: %v, %v", ok, err)
		}
		if ok, err := TryLock(ctx, other, "other-namespace", 1); !ok || err != nil {
			t.Fatalf("TryLock in another namespace: %v, %v", ok, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if ok, err := TryLock(ctx, other, "acct", 1, 2); !ok || err != nil {
			t.Fatalf("TryLock after the holder committed: %v, %v", ok, err)
		}
	})
	t.Run("cancel mid-wait releases what the call took", func(t *testing.T) {
		holder := beginTx(t, db, readOnly)
		defer holder.Rollback()
		if err := Lock(ctx, holder, "acct", 20); err != nil {
			t.Fatal(err)
		}
		waiter := beginTx(t, db, readOnly)
		defer waiter.Rollback()
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := Lock(cctx, waiter, "acct", 10, 20); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock waiting on a held id: %v", err)
		}
		third := beginTx(t, db, readOnly)
		defer third.Rollback()
		if ok, _ := TryLock(ctx, third, "acct", 10); !ok {
			t.Fatal("id 10, taken by the cancelled call, is still held")
		}
	})
	t.Run("TryLock takes all or none", func(t *testing.T) {
		holder := beginTx(t, db, readOnly)
		defer holder.Rollback()
		if err := Lock(ctx, holder, "acct", 32); err != nil {
			t.Fatal(err)
		}
		tx := beginTx(t, db, readOnly)
		defer tx.Rollback()
		if ok, err := TryLock(ctx, tx, "acct", 31, 32, 33); ok || err != nil {
			t.Fatalf("TryLock with one id held: %v, %v", ok, err)
		}
		other := beginTx(t, db, readOnly)
		defer other.Rollback()
		if ok, _ := TryLock(ctx, other, "acct", 31, 33); !ok {
			t.Fatal("a failed TryLock kept some of its ids")
		}
	})
	t.Run("rollback and context end release", func(t *testing.T) {
		tctx, cancel := context.WithCancel(ctx)
		tx, err := db.BeginTx(tctx, readOnly)
		if err != nil {
			t.Fatal(err)
		}
		if err := Lock(tctx, tx, "acct", 40); err != nil {
			t.Fatal(err)
		}
		cancel() // database/sql rolls the transaction back
		other := beginTx(t, db, readOnly)
		defer other.Rollback()
		waitFor(t, 5*time.Second, "the cancelled transaction's lock to be released", func() bool {
			ok, _ := TryLock(ctx, other, "acct", 40)
			return ok
		})
	})
	if n := db.Stats().InUse; n > 0 {
		t.Logf("%d connections in use", n)
	}
}

func TestLockNeedsALockhooksTransaction(t *testing.T) {
	ctx := context.Background()
	if err := Lock(ctx, nil, "x", 1); err == nil || !strings.Contains(err.Error(), "nil *sql.Tx") {
		t.Errorf("nil tx: %v", err)
	}
	raw, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "raw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tx := beginTx(t, raw, nil)
	defer tx.Rollback()
	if err := Lock(ctx, tx, "x", 1); err == nil || !strings.Contains(err.Error(), "opened through lockhooks") {
		t.Errorf("raw modernc transaction: %v", err)
	}
}

func TestLockAfterSnapshot(t *testing.T) {
	db, _ := openSQLiteFile(t)
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	ro := beginTx(t, db, readOnly)
	defer ro.Rollback()
	var n int
	if err := ro.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := Lock(ctx, ro, "t", 1); !errors.Is(err, ErrLockAfterSnapshot) {
		t.Errorf("Lock after a read in a read-only SQLite transaction: %v", err)
	}
	ro.Rollback()
	// A write transaction began IMMEDIATE under the writer lock: its
	// snapshot is current, so reading first is fine.
	w := beginTx(t, db, nil)
	defer w.Rollback()
	if err := w.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := Lock(ctx, w, "t", 1); err != nil {
		t.Errorf("Lock after a read in a write transaction: %v", err)
	}
}

// B waits in Lock for A, which commits a write; B must see it. A variant
// that releases before COMMIT (broken on purpose) must fail the same test.
func TestReleaseAfterCommitIsObserved(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("release before commit=%v", broken), func(t *testing.T) {
			var bRead chan int
			var opts []Option
			if broken {
				opts = append(opts, func(o *options) {
					o.testReleaseBeforeCommit = func() {
						select { // let B read before A commits
						case v := <-bRead:
							bRead <- v
						case <-time.After(5 * time.Second):
						}
					}
				})
			}
			db, _ := openSQLiteFile(t, opts...)
			mustExec(t, db, "CREATE TABLE c (id INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO c VALUES (1, 0)")
			ctx := context.Background()
			stale := 0
			const iterations = 30
			for i := range iterations {
				bRead = make(chan int, 1)
				a := beginTx(t, db, nil)
				if err := Lock(ctx, a, "c", 1); err != nil {
					t.Fatal(err)
				}
				if _, err := a.Exec("UPDATE c SET v = v + 1 WHERE id = 1"); err != nil {
					t.Fatal(err)
				}
				bDone := make(chan error, 1)
				go func() {
					b, err := db.BeginTx(ctx, readOnly)
					if err != nil {
						bDone <- err
						return
					}
					defer b.Rollback()
					if err := Lock(ctx, b, "c", 1); err != nil {
						bDone <- err
						return
					}
					var v int
					if err := b.QueryRow("SELECT v FROM c WHERE id = 1").Scan(&v); err != nil {
						bDone <- err
						return
					}
					if v != i+1 {
						stale++
					}
					bRead <- v
					bDone <- nil
				}()
				waitFor(t, 5*time.Second, "B to wait for the lock", func() bool { return db.Stats().InUse == 2 })
				if err := a.Commit(); err != nil {
					t.Fatal(err)
				}
				if err := <-bDone; err != nil {
					t.Fatal(err)
				}
			}
			if broken && stale == 0 {
				t.Error("the broken variant was never caught: the test cannot see a release before commit")
			}
			if !broken && stale != 0 {
				t.Errorf("B read a stale value %d times of %d", stale, iterations)
			}
		})
	}
}

// isBusy reports an SQLITE_BUSY (or SQLITE_LOCKED) from modernc.
func isBusy(err error) bool {
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		code := lite.Code() & 0xff
		return code == 5 || code == 6
	}
	return false
}

// bankTransfers runs workers × transfers random transfers between accounts;
// lock selects whether they Lock the two accounts first. It returns the
// final total and the errors, counting SQLITE_BUSY ones.
func bankTransfers(t *testing.T, db *sql.DB, workers, transfers, accounts int, lock bool, placeholder func(int) string) (total int, errs, busy int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var nErr, nBusy atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		r := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			for range transfers {
				from, to := r.IntN(accounts), r.IntN(accounts)
				for to == from {
					to = r.IntN(accounts)
				}
				amount := 1 + r.IntN(10)
				err := func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					if lock {
						if err := Lock(ctx, tx, "accounts", from, to); err != nil {
							return err
						}
					}
					var fromBal, toBal int
					sel := "SELECT balance FROM accounts WHERE id = " + placeholder(1)
					if err := tx.QueryRowContext(ctx, sel, from).Scan(&fromBal); err != nil {
						return err
					}
					if err := tx.QueryRowContext(ctx, sel, to).Scan(&toBal); err != nil {
						return err
					}
					upd := "UPDATE accounts SET balance = " + placeholder(1) + " WHERE id = " + placeholder(2)
					if _, err := tx.ExecContext(ctx, upd, fromBal-amount, from); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, upd, toBal+amount, to); err != nil {
						return err
					}
					return tx.Commit()
				}()
				if err != nil {
					nErr.Add(1)
					if isBusy(err) {
						nBusy.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	if err := db.QueryRow("SELECT sum(balance) FROM accounts").Scan(&total); err != nil {
		t.Fatal(err)
	}
	return total, nErr.Load(), nBusy.Load()
}

func createAccounts(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	mustExec(t, db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
	for i := range n {
		mustExec(t, db, fmt.Sprintf("INSERT INTO accounts VALUES (%d, 1000)", i))
	}
}

// The seed's bank transfer on an SQLite file: conserved and error-free
// through lockhooks; on the raw driver, busy errors or lost updates.
func TestBankTransfersOnSQLite(t *testing.T) {
	const workers, transfers, accounts = 8, 500, 10
	q := func(int) string { return "?" }
	db, path := openSQLiteFile(t)
	createAccounts(t, db, accounts)
	total, errs, busy := bankTransfers(t, db, workers, transfers, accounts, true, q)
	if total != accounts*1000 || errs != 0 || busy != 0 {
		t.Errorf("lockhooks: total %d (want %d), %d errors, %d SQLITE_BUSY", total, accounts*1000, errs, busy)
	}

	raw, err := sql.Open("sqlite", path+"?_pragma=synchronous(NORMAL)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	mustExec(t, raw, "UPDATE accounts SET balance = 1000")
	rawTotal, rawErrs, rawBusy := bankTransfers(t, raw, workers, transfers/5, accounts, false, q)
	t.Logf("raw modernc: total %d (want %d), %d errors (%d SQLITE_BUSY) in %d transfers; lockhooks: 0 errors in %d",
		rawTotal, accounts*1000, rawErrs, rawBusy, workers*transfers/5, workers*transfers)
	if rawTotal == accounts*1000 && rawErrs == 0 {
		t.Error("the raw driver showed neither errors nor lost updates: the workload does not show what it should")
	}
}

// Transactions that read and then write: the deferred BEGIN of raw modernc
// fails with SQLITE_BUSY at the write; lockhooks begins them IMMEDIATE
// under its writer lock.
func TestReadThenWriteHasNoBusy(t *testing.T) {
	const workers, txs = 8, 25
	run := func(db *sql.DB) (failures int64) {
		var n atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range txs {
					err := func() error {
						tx, err := db.Begin()
						if err != nil {
							return err
						}
						defer tx.Rollback()
						var v int
						if err := tx.QueryRow("SELECT v FROM c WHERE id = 1").Scan(&v); err != nil {
							return err
						}
						if _, err := tx.Exec("UPDATE c SET v = ? WHERE id = 1", v+1); err != nil {
							return err
						}
						return tx.Commit()
					}()
					if err != nil {
						n.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return n.Load()
	}
	db, path := openSQLiteFile(t)
	mustExec(t, db, "CREATE TABLE c (id INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO c VALUES (1, 0)")
	if f := run(db); f != 0 {
		t.Errorf("lockhooks: %d failed transactions", f)
	}
	var v int
	if err := db.QueryRow("SELECT v FROM c").Scan(&v); err != nil || v != workers*txs {
		t.Errorf("counter %d (%v), want %d", v, err, workers*txs)
	}
	raw, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	f := run(raw)
	t.Logf("raw modernc with busy_timeout=5000: %d of %d transactions failed", f, workers*txs)
	if f == 0 {
		t.Error("the raw driver had no failure: the workload does not show what it should")
	}
}

func TestWriterLock(t *testing.T) {
	db, _ := openSQLiteFile(t, WithBusyTimeout(100*time.Millisecond))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	first := beginTx(t, db, nil)
	// The waiters run on this goroutine with a context of their own: not
	// the holder's call chain, so they wait (TestSelfWait* has the rest).
	other, cancelOther := context.WithCancel(context.Background())
	defer cancelOther()

	// Writers have never waited. Where frame pointers make a stack capture
	// cheap (amd64, arm64), the holder's site is recorded anyway; elsewhere
	// it is not (a stack walk each write transaction would pay for), and
	// the error says so and names its connection.
	_, err := db.BeginTx(other, nil)
	if !errors.Is(err, ErrWriterLockTimeout) || !strings.Contains(err.Error(), "connection #") {
		t.Fatalf("a second writer: %v, want ErrWriterLockTimeout naming the holder's connection", err)
	}
	if want := "not recorded"; !callsite.FastCapture && !strings.Contains(err.Error(), want) {
		t.Errorf("a second writer: %v, want %q", err, want)
	} else if want := "transaction begun at"; callsite.FastCapture && !strings.Contains(err.Error(), want) {
		t.Errorf("a second writer: %v, want %q", err, want)
	}
	first.Rollback()
	if connectorOf(t, db).writer.siteWanted.Load() {
		t.Error("the request for the site outlived the holder")
	}

	// Writers waited within the last minute: a new holder records where it
	// began.
	holder := beginTx(t, db, nil)
	defer holder.Rollback()
	_, err = db.BeginTx(other, nil)
	if !errors.Is(err, ErrWriterLockTimeout) || !strings.Contains(err.Error(), "_test.go:") || !strings.Contains(err.Error(), "transaction begun at") {
		t.Fatalf("a writer after contention: %v, want ErrWriterLockTimeout naming where the holder began", err)
	}
	if _, err := db.ExecContext(other, "INSERT INTO t VALUES (1)"); !errors.Is(err, ErrWriterLockTimeout) {
		t.Fatalf("an autocommit write: %v, want ErrWriterLockTimeout", err)
	}
	// A writer waiting for an autocommit statement is told the statement.
	var w writerLock
	if err := w.lock(context.Background(), noTelemetry, 1, 0, "INSERT INTO big VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := w.lock(context.Background(), noTelemetry, 2, 10*time.Millisecond, ""); err == nil || !strings.Contains(err.Error(), "INSERT INTO big") {
		t.Fatalf("waiting for a statement: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (1)"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an autocommit write with a short context: %v", err)
	}
	// Readers do not wait.
	var n int
	if err := db.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	ro := beginTx(t, db, readOnly)
	ro.Rollback()
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, "INSERT INTO t VALUES (1)")
}

// An uncontended transaction records where it began only within siteWindow
// of the last wait.
func TestWriterLockRecordsSitesAfterRecentWaits(t *testing.T) {
	var w writerLock
	whereAfterLock := func(lastWait time.Time) string {
		t.Helper()
		w.mu.Lock()
		w.contended = lastWait
		w.mu.Unlock()
		if err := w.lock(context.Background(), noTelemetry, 1, 0, ""); err != nil {
			t.Fatal(err)
		}
		defer w.unlock()
		h, _ := w.holder()
		return h.location()
	}
	for _, c := range []struct {
		name     string
		lastWait time.Time
		recorded bool
	}{
		{"never", time.Time{}, false},
		{"long ago", time.Now().Add(-siteWindow - time.Second), false},
		{"just now", time.Now(), true},
	} {
		where := whereAfterLock(c.lastWait)
		if recorded := strings.Contains(where, "_test.go:"); recorded != (c.recorded || callsite.FastCapture) {
			t.Errorf("last wait %s: the holder's site is %q, recorded %v, want %v", c.name, where, recorded, c.recorded)
		}
	}
}

// A writer that waits for a transaction whose site was not recorded asks
// for it; the holder's next statement records where it runs.
func TestWriterLockHolderSiteAtNextStatement(t *testing.T) {
	if callsite.FastCapture {
		t.Skip("SKIP: with frame-pointer captures (amd64, arm64) every write transaction records where it began; the next-statement fallback serves other architectures")
	}
	db, _ := openSQLiteFile(t, WithBusyTimeout(time.Minute))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	w := &connectorOf(t, db).writer
	holder := beginTx(t, db, nil)
	defer holder.Rollback()
	if h, _ := w.holder(); h.location() != "not recorded" {
		t.Fatalf("an uncontended holder's site: %q, want not recorded", h.location())
	}

	waited := make(chan error, 1)
	go func() {
		tx, err := db.BeginTx(context.Background(), nil)
		if err == nil {
			err = tx.Rollback()
		}
		waited <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !w.siteWanted.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never asked for the holder's site")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := holder.Exec("INSERT INTO t VALUES (1)"); err != nil { // the holder's next statement
		t.Fatal(err)
	}
	h, _ := w.holder()
	if !strings.Contains(h.location(), "_test.go:") || !strings.Contains(h.location(), "a later statement") {
		t.Errorf("the holder's site after its next statement: %q", h.location())
	}
	if d := h.describe(); !strings.Contains(d, "that ran a statement at") {
		t.Errorf("the holder described as %q", d)
	}
	if w.siteWanted.Load() {
		t.Error("the request for the site is still pending")
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if _, held := w.holder(); held {
		t.Error("the writer lock is still held")
	}
}

func TestSQLiteConnectionDefaults(t *testing.T) {
	pragma := func(db *sql.DB, name string) string {
		var v string
		if err := db.QueryRow("PRAGMA " + name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	db, _ := openSQLiteFile(t)
	for name, want := range map[string]string{"journal_mode": "wal", "foreign_keys": "1", "busy_timeout": "5000"} {
		if got := pragma(db, name); got != want {
			t.Errorf("PRAGMA %s = %s, want %s", name, got, want)
		}
	}
	own, err := Open("sqlite", filepath.Join(t.TempDir(), "own.db")+"?_pragma=foreign_keys(0)&_pragma=busy_timeout(123)")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if got := pragma(own, "foreign_keys"); got != "0" {
		t.Errorf("the DSN's foreign_keys(0) was overridden: %s", got)
	}
	if got := pragma(own, "busy_timeout"); got != "123" {
		t.Errorf("the DSN's busy_timeout was overridden: %s", got)
	}
}

// The same bank transfer on Postgres through Lock, from two replicas:
// conserved, no deadlock.
func TestBankTransfersOnPostgres(t *testing.T) {
	const workers, transfers, accounts = 4, 100, 10
	dbs := twoReplicas(t)
	createAccounts(t, dbs[0], accounts)
	q := func(n int) string { return fmt.Sprintf("$%d", n) }
	var wg sync.WaitGroup
	var errs [2]int64
	for i, db := range dbs {
		wg.Go(func() { _, errs[i], _ = bankTransfers(t, db, workers, transfers, accounts, true, q) })
	}
	wg.Wait()
	var total int
	if err := dbs[0].QueryRow("SELECT sum(balance) FROM accounts").Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != accounts*1000 || errs[0]+errs[1] != 0 {
		t.Errorf("total %d (want %d), errors %v", total, accounts*1000, errs)
	}
	noAdvisoryLocksLeft(t, dbs[0])
}

func TestLocksetOnPostgres(t *testing.T) {
	db, err := Open("pgx", pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	holder := beginTx(t, db, nil)
	defer holder.Rollback()
	if err := Lock(ctx, holder, "jobs", 2); err != nil {
		t.Fatal(err)
	}
	tx := beginTx(t, db, nil)
	defer tx.Rollback()
	if ok, err := TryLock(ctx, tx, "jobs", 1, 2, 3); ok || err != nil {
		t.Fatalf("TryLock with one key held: %v, %v", ok, err)
	}
	var pid, held int
	if err := tx.QueryRow("SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", pid).Scan(&held); err != nil || held != 0 {
		t.Fatalf("a failed TryLock holds %d keys (%v)", held, err)
	}
	if ok, err := TryLock(ctx, tx, "jobs", 1, 3); !ok || err != nil {
		t.Fatalf("TryLock of free keys: %v, %v", ok, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	rr := beginTx(t, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	defer rr.Rollback()
	if err := Lock(ctx, rr, "jobs", 1); !errors.Is(err, ErrLockAfterSnapshot) {
		t.Errorf("Lock in a REPEATABLE READ transaction: %v", err)
	}
}

// A read-only CTE that calls replace() is a read: its open rows do not hold
// the writer lock, so a writer in the same process goes ahead (issue 11).
func TestReadOnlyCTEDoesNotTakeTheWriterLock(t *testing.T) {
	db, _ := openSQLiteFile(t, WithBusyTimeout(200*time.Millisecond))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
	mustExec(t, db, "INSERT INTO t VALUES (1, 'a b'), (2, 'c d')")
	rows, err := db.Query("WITH x AS (SELECT replace(name, ' ', '-') AS n FROM t) SELECT n FROM x")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	if !rows.Next() {
		t.Fatal(rows.Err())
	}
	if _, err := db.Exec("INSERT INTO t VALUES (3, 'e f')"); err != nil {
		t.Fatalf("a writer while the CTE's rows are open: %v", err)
	}
	// A WITH … INSERT still takes it.
	tx := beginTx(t, db, nil)
	defer tx.Rollback()
	other, cancel := context.WithCancel(context.Background()) // not the holder's call chain: it waits (see ErrSelfWait)
	defer cancel()
	if _, err := db.ExecContext(other, "WITH x AS (SELECT 4 AS id) INSERT INTO t SELECT id, 'g' FROM x"); !errors.Is(err, ErrWriterLockTimeout) {
		t.Fatalf("a WITH … INSERT while a write transaction is open: %v, want ErrWriterLockTimeout", err)
	}
}

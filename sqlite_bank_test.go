package lockhooks

// Bank transfers through locksets, on SQLite and on Postgres: no lost update,
// balances conserved, no BUSY.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

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

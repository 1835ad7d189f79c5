package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks"
)

// demo runs the scenarios against one database.
type demo struct {
	cfg        config
	out        io.Writer
	tel        *telemetry
	sqlitePath string // "" on Postgres
	live       *live  // the databases -serve shows; nil without -serve
}

func (d *demo) postgres() bool { return d.sqlitePath == "" }

// ph returns the n-th bind parameter of the dialect.
func (d *demo) ph(n int) string {
	if d.postgres() {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// open opens the demo database, raw or through lockhooks.
func (d *demo) open(wrapped bool) (*sql.DB, error) {
	if wrapped {
		driver, dsn := "sqlite", d.sqlitePath
		if d.postgres() {
			driver, dsn = "pgx", d.cfg.postgres
		}
		db, err := lockhooks.Open(driver, dsn, d.tel.options()...)
		if err == nil && d.live != nil {
			d.live.add(db)
		}
		return db, err
	}
	if d.postgres() {
		return sql.Open("pgx", d.cfg.postgres)
	}
	// What people do by hand: WAL and a busy timeout.
	return sql.Open("sqlite", d.sqlitePath+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
}

// progress prints a live line until stop is closed.
func (d *demo) progress(label string, done, errs *atomic.Int64, total int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			fmt.Fprintf(d.out, "\r  %-10s %5d/%d done, %d errors", label, done.Load(), total, errs.Load())
			select {
			case <-stop:
				fmt.Fprintf(d.out, "\r  %-10s %5d/%d done, %d errors\n", label, done.Load(), total, errs.Load())
				return
			case <-t.C:
			}
		}
	})
	return &wg
}

// bankTransfers: concurrent read-modify-write transfers between accounts.
// Raw, they lose updates or fail with "database is locked"; through
// lockhooks, Lock(tx, "accounts", from, to) serialises each pair and the
// total is conserved.
func (d *demo) bankTransfers(ctx context.Context) result {
	const accounts, balance = 10, 1000
	r := result{name: "bank transfers"}
	fmt.Fprintf(d.out, "1. Bank transfers: %d workers x %d random transfers between %d accounts\n", d.cfg.workers, d.cfg.transfers, accounts)
	run := func(wrapped bool) (total int, errs int64, err error) {
		db, err := d.open(wrapped)
		if err != nil {
			return 0, 0, err
		}
		defer d.close(db)
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS demo_accounts"); err != nil {
			return 0, 0, err
		}
		if _, err := db.ExecContext(ctx, "CREATE TABLE demo_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"); err != nil {
			return 0, 0, err
		}
		for i := range accounts {
			if _, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO demo_accounts VALUES (%d, %d)", i, balance)); err != nil {
				return 0, 0, err
			}
		}
		var done, nerr atomic.Int64
		stop := make(chan struct{})
		label := "raw"
		if wrapped {
			label = "lockhooks"
		}
		pw := d.progress(label, &done, &nerr, d.cfg.workers*d.cfg.transfers, stop)
		var wg sync.WaitGroup
		for w := range d.cfg.workers {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			wg.Go(func() {
				for range d.cfg.transfers {
					from, to := rng.IntN(accounts), rng.IntN(accounts-1)
					if to >= from {
						to++
					}
					if err := d.transfer(ctx, db, wrapped, from, to, 1+rng.IntN(10)); err != nil {
						nerr.Add(1)
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		close(stop)
		pw.Wait()
		err = db.QueryRowContext(ctx, "SELECT sum(balance) FROM demo_accounts").Scan(&total)
		return total, nerr.Load(), err
	}
	rawTotal, rawErrs, err := run(false)
	if err != nil {
		r.err = err
		return r
	}
	total, errs, err := run(true)
	if err != nil {
		r.err = err
		return r
	}
	want := accounts * balance
	r.raw = fmt.Sprintf("total %d (%+d), %d errors", rawTotal, rawTotal-want, rawErrs)
	r.wrapped = fmt.Sprintf("total %d (%+d), %d errors", total, total-want, errs)
	r.kept = total == want && errs == 0
	return r
}

// transfer moves amount between two accounts, reading then writing.
func (d *demo) transfer(ctx context.Context, db *sql.DB, lock bool, from, to, amount int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if lock {
		if err := lockhooks.Lock(ctx, tx, "accounts", from, to); err != nil {
			return err
		}
	}
	sel := "SELECT balance FROM demo_accounts WHERE id = " + d.ph(1)
	var a, b int
	if err := tx.QueryRowContext(ctx, sel, from).Scan(&a); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, sel, to).Scan(&b); err != nil {
		return err
	}
	upd := "UPDATE demo_accounts SET balance = " + d.ph(1) + " WHERE id = " + d.ph(2)
	if _, err := tx.ExecContext(ctx, upd, a-amount, from); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, upd, b+amount, to); err != nil {
		return err
	}
	return tx.Commit()
}

// advisoryLeak: on Postgres, a session advisory lock taken with db.Exec and
// released with db.QueryRow on another pooled connection (dstack #3881).
// On SQLite, which has no advisory locks, a named lock guarding a
// read-then-write counter.
func (d *demo) advisoryLeak(ctx context.Context) result {
	if d.postgres() {
		return d.advisoryLeakPostgres(ctx)
	}
	const workers, iters = 8, 50
	r := result{name: "named lock (advisory)"}
	fmt.Fprintf(d.out, "2. A named lock around a read-then-write counter: %d workers x %d increments\n", workers, iters)
	run := func(wrapped bool) (int, error) {
		db, err := d.open(wrapped)
		if err != nil {
			return 0, err
		}
		defer d.close(db)
		for _, q := range []string{"DROP TABLE IF EXISTS demo_counter", "CREATE TABLE demo_counter (n INTEGER NOT NULL)", "INSERT INTO demo_counter VALUES (0)"} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return 0, err
			}
		}
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range iters {
					var l *lockhooks.AdvisoryLock
					if wrapped {
						var err error
						if l, err = lockhooks.AcquireAdvisoryLock(ctx, db, lockhooks.LockID("demo_counter")); err != nil {
							continue
						}
					}
					var n int
					if db.QueryRowContext(ctx, "SELECT n FROM demo_counter").Scan(&n) == nil {
						db.ExecContext(ctx, "UPDATE demo_counter SET n = ?", n+1)
					}
					if l != nil {
						l.Release(ctx)
					}
				}
			})
		}
		wg.Wait()
		var n int
		err = db.QueryRowContext(ctx, "SELECT n FROM demo_counter").Scan(&n)
		return n, err
	}
	rawN, err := run(false)
	if err != nil {
		r.err = err
		return r
	}
	n, err := run(true)
	if err != nil {
		r.err = err
		return r
	}
	r.raw = fmt.Sprintf("no named lock: %d/%d counted", rawN, workers*iters)
	r.wrapped = fmt.Sprintf("AcquireAdvisoryLock: %d/%d", n, workers*iters)
	r.kept = n == workers*iters
	fmt.Fprintf(d.out, "  raw %s; lockhooks %s\n", r.raw, r.wrapped)
	return r
}

func (d *demo) advisoryLeakPostgres(ctx context.Context) result {
	const key = 3881
	r := result{name: "unlock on another pooled conn"}
	fmt.Fprintf(d.out, "2. db.Exec(pg_advisory_lock), then db.QueryRow(pg_advisory_unlock) on another pooled connection\n")
	run := func(wrapped bool) (unlocked bool, held int, err error) {
		db, err := d.open(wrapped)
		if err != nil {
			return false, 0, err
		}
		defer d.close(db)
		if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return false, 0, err
		}
		busy, err := db.Conn(ctx) // the pool hands the unlock to another connection
		if err != nil {
			return false, 0, err
		}
		err = db.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&unlocked)
		busy.Close()
		if err != nil {
			return false, 0, err
		}
		err = db.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1", key).Scan(&held)
		return unlocked, held, err
	}
	rawOK, rawHeld, err := run(false)
	if err != nil {
		r.err = err
		return r
	}
	ok, held, err := run(true)
	if err != nil {
		r.err = err
		return r
	}
	r.raw = fmt.Sprintf("unlock=%v, lock leaked: %v", rawOK, rawHeld > 0)
	r.wrapped = fmt.Sprintf("unlock=%v, lock leaked: %v", ok, held > 0)
	r.kept = ok && held == 0
	fmt.Fprintf(d.out, "  raw %s; lockhooks %s\n", r.raw, r.wrapped)
	return r
}

// foreignKeys: transactions insert a child row, then lock the parent FOR
// UPDATE and update it — the FK check's KEY SHARE lock makes this deadlock
// (Postgres). lockhooks sends FOR NO KEY UPDATE.
func (d *demo) foreignKeys(ctx context.Context) result {
	r := result{name: "parent lock + FK child inserts"}
	fmt.Fprintf(d.out, "3. Parent-row locks with foreign-key child inserts\n")
	if !d.postgres() {
		r.skipped = "needs PostgreSQL (-postgres DSN)"
		fmt.Fprintf(d.out, "  skipped: SQLite has no row locks; run with -postgres DSN\n")
		return r
	}
	const workers, iters = 4, 5 // each raw deadlock waits deadlock_timeout (1s by default)
	run := func(wrapped bool) (deadlocks int64, err error) {
		db, err := d.open(wrapped)
		if err != nil {
			return 0, err
		}
		defer d.close(db)
		for _, q := range []string{
			"DROP TABLE IF EXISTS demo_child", "DROP TABLE IF EXISTS demo_parent",
			"CREATE TABLE demo_parent (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)",
			"CREATE TABLE demo_child (id serial PRIMARY KEY, parent_id int NOT NULL REFERENCES demo_parent (id))",
			"INSERT INTO demo_parent (id) VALUES (1)",
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return 0, err
			}
		}
		var n atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range iters {
					err := func() error {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						defer tx.Rollback()
						for _, q := range []string{
							"INSERT INTO demo_child (parent_id) VALUES (1)",
							"SELECT id FROM demo_parent WHERE id = 1 FOR UPDATE",
							"UPDATE demo_parent SET n = n + 1 WHERE id = 1",
						} {
							if _, err := tx.ExecContext(ctx, q); err != nil {
								return err
							}
						}
						return tx.Commit()
					}()
					var pg interface{ SQLState() string }
					if errors.As(err, &pg) && pg.SQLState() == "40P01" {
						n.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return n.Load(), nil
	}
	rawDeadlocks, err := run(false)
	if err != nil {
		r.err = err
		return r
	}
	deadlocks, err := run(true)
	if err != nil {
		r.err = err
		return r
	}
	r.raw = fmt.Sprintf("%d deadlocks in %d txs", rawDeadlocks, workers*iters)
	r.wrapped = fmt.Sprintf("%d deadlocks in %d txs", deadlocks, workers*iters)
	r.kept = deadlocks == 0
	fmt.Fprintf(d.out, "  raw %s; lockhooks %s\n", r.raw, r.wrapped)
	return r
}

// slowestWaits prints the longest lock waits lockhooks traced.
func (d *demo) slowestWaits() {
	waits := d.tel.slowest(5)
	fmt.Fprintf(d.out, "\n4. The slowest lock waits lockhooks traced (of %d)\n", d.tel.count())
	if len(waits) == 0 {
		fmt.Fprintln(d.out, "  none")
		return
	}
	fmt.Fprintf(d.out, "  %-14s %-22s %10s  %-12s %s\n", "kind", "keys", "wait", "outcome", "holder taken at")
	for _, w := range waits {
		fmt.Fprintf(d.out, "  %-14s %-22s %10s  %-12s %s\n", w.kind, truncate(w.keys, 22), w.wait.Round(time.Microsecond), w.outcome, w.holder)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

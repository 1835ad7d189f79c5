package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// walSwitchFiles and walSwitchConns: how many fresh files
// TestWALSwitchOnFreshFile opens, and how many connections it opens at
// once on each. Before the switch was serialised and retried, about one
// file in 70 had a first connection fail with SQLITE_BUSY from
// PRAGMA journal_mode = WAL.
const (
	walSwitchFiles = 800
	walSwitchConns = 8
)

// TestWALSwitchOnFreshFile opens walSwitchConns connections at once on
// each of walSwitchFiles new files, so that every connection's default
// pragmas race to switch the file to WAL: none may fail, and every
// connection must then see the file in WAL mode. On every other file the
// connections belong to two database handles (two connectors, whose
// switches only the retry within the busy timeout keeps apart), on the
// others to one (whose switches take turns).
func TestWALSwitchOnFreshFile(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	failed := 0
	for i := range walSwitchFiles {
		handles := 1 + i%2
		err := openAllAtOnce(filepath.Join(dir, fmt.Sprintf("f%d.db", i)), handles, walSwitchConns)
		if err != nil {
			if failed == 0 {
				t.Errorf("file %d of %d (%d handle%s): %v", i+1, walSwitchFiles, handles, plural(handles), err)
			}
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d files failed", failed, walSwitchFiles)
	}
	t.Logf("%d files × %d connections in %v", walSwitchFiles, walSwitchConns, time.Since(start).Round(time.Millisecond))
}

// openAllAtOnce opens handles databases on the new file path and has n
// goroutines (spread over the handles) each take a connection at the same
// moment (the pools are empty, so each is a new physical connection); it
// checks that each one connected and reads journal_mode wal while all n
// are open.
func openAllAtOnce(path string, handles, n int) error {
	dbs := make([]*sql.DB, handles)
	for h := range dbs {
		db, err := Open("sqlite", "file:"+path)
		if err != nil {
			return err
		}
		defer db.Close()
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
		dbs[h] = db
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		ready, connected, done sync.WaitGroup
		errs                   = make([]error, n)
		start                  = make(chan struct{})
	)
	ready.Add(n)
	connected.Add(n)
	for g := range n {
		done.Go(func() {
			ready.Done()
			<-start // the barrier: all n connect together
			conn, err := dbs[g%handles].Conn(ctx)
			connected.Done()
			if err != nil {
				errs[g] = fmt.Errorf("connection %d: %w", g, err)
				return
			}
			defer conn.Close()
			var mode string
			if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
				errs[g] = fmt.Errorf("connection %d: reading journal_mode: %w", g, err)
			} else if mode != "wal" {
				errs[g] = fmt.Errorf("connection %d: journal_mode %q, want wal", g, mode)
			}
			connected.Wait() // hold the connection until all n have theirs
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	open := 0
	for _, db := range dbs {
		open += db.Stats().OpenConnections
	}
	if open != n {
		return fmt.Errorf("%d connections open, want %d distinct", open, n)
	}
	return nil
}

// holdWriteLock creates a table in the new file path (in rollback mode, as
// SQLite opens it) and keeps an IMMEDIATE transaction open on it, through
// a database handle that is not lockhooks'; commit ends that transaction.
func holdWriteLock(t *testing.T, path string) (commit func()) {
	t.Helper()
	ctx := context.Background()
	holder, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	hc, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.Close() })
	for _, q := range []string{"CREATE TABLE t (x)", "BEGIN IMMEDIATE", "INSERT INTO t VALUES (1)"} {
		if _, err := hc.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return func() {
		if _, err := hc.ExecContext(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWALSwitchWaitsBusyTimeout holds the write lock of a file in rollback
// mode from another database handle, which makes SQLite answer the WAL
// switch SQLITE_BUSY at once without its busy handler: a new lockhooks
// connection keeps trying for its busy timeout (WithBusyTimeout's, or the
// DSN's busy_timeout), no less, then fails with an error that says so and
// wraps SQLITE_BUSY. Once the lock is released, a new connection switches
// the file to WAL.
func TestWALSwitchWaitsBusyTimeout(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		opts        []Option
		budget      time.Duration
	}{
		{"WithBusyTimeout", "", []Option{WithBusyTimeout(300 * time.Millisecond)}, 300 * time.Millisecond},
		{"DSN", "?_pragma=busy_timeout(300)", nil, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "held.db")
			commit := holdWriteLock(t, path)

			db, err := Open("sqlite", "file:"+path+tc.query, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			began := time.Now()
			err = db.PingContext(ctx)
			took := time.Since(began)
			if err == nil {
				t.Fatal("a connection switched the file to WAL while another handle held its write lock")
			}
			if !IsLockNotAvailable(err) || !strings.Contains(err.Error(), "journal_mode = WAL") || !strings.Contains(err.Error(), "busy timeout") {
				t.Fatalf("want an SQLITE_BUSY from the WAL switch that names the busy timeout, got %v", err)
			}
			if took < tc.budget {
				t.Fatalf("gave up after %v, before the busy timeout of %v: %v", took, tc.budget, err)
			}
			t.Logf("gave up after %v: %v", took.Round(time.Millisecond), err)

			commit()
			var mode string
			if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
				t.Fatalf("after the holder committed: journal_mode %q, %v; want wal", mode, err)
			}
		})
	}
}

// TestWALSwitchHonoursContext: a WAL switch retrying SQLITE_BUSY within a
// busy timeout of a minute gives up when the connection's context ends.
func TestWALSwitchHonoursContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "held.db")
	holdWriteLock(t, path)
	db, err := Open("sqlite", "file:"+path, WithBusyTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	began := time.Now()
	err = db.PingContext(ctx)
	took := time.Since(began)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "WAL") {
		t.Fatalf("want the WAL switch to give up with the context's deadline, got %v", err)
	}
	if took > 10*time.Second {
		t.Fatalf("gave up after %v, long after the context's deadline of 200ms", took)
	}
	t.Logf("gave up after %v: %v", took.Round(time.Millisecond), err)
}

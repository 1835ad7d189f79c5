package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/lockhooks/lockhooks"
)

// debugPath is where -serve mounts lockhooks.DebugHandler, metricsPath
// where it serves lockhooks' metrics in the Prometheus format.
const (
	debugPath   = "/debug/locks"
	metricsPath = "/metrics"
)

// live is the set of lockhooks databases the demo has open, shown by
// -serve's page while the scenarios run.
type live struct {
	mu  sync.Mutex
	dbs []*sql.DB
	h   http.Handler // DebugHandler of dbs; nil after they changed
}

func (l *live) add(db *sql.DB) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dbs, l.h = append(l.dbs, db), nil
}

func (l *live) remove(db *sql.DB) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.dbs, db); i >= 0 {
		l.dbs, l.h = slices.Delete(l.dbs, i, i+1), nil
	}
}

// ServeHTTP shows the databases open now. The demo has no users to keep
// out; a real service mounts DebugHandler behind its own authentication.
func (l *live) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	if l.h == nil {
		l.h = lockhooks.DebugHandler(l.dbs...)
	}
	h := l.h
	l.mu.Unlock()
	h.ServeHTTP(w, r)
}

// serve starts the debug page's server on addr and returns its URL and a
// function that stops it.
func (d *demo) serve(addr string) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("-serve %s: %w", addr, err)
	}
	d.live = &live{}
	mux := http.NewServeMux()
	mux.Handle(debugPath, d.live)
	mux.Handle(metricsPath, d.tel.metrics)
	mux.Handle("/{$}", http.RedirectHandler(debugPath, http.StatusFound))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	url := "http://" + net.JoinHostPort(host, port) + debugPath
	return url, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}

// close closes a database the demo opened.
func (d *demo) close(db *sql.DB) {
	if d.live != nil {
		d.live.remove(db)
	}
	db.Close()
}

// showcase keeps a lock held and waited for, again and again, so that the
// debug page has something to show after the scenarios, until ctx ends.
// Each round's waits outlast the default slow-wait threshold, so the log
// shows what a service without tracing sees.
func (d *demo) showcase(ctx context.Context) error {
	db, err := d.open(true)
	if err != nil {
		return err
	}
	defer d.close(db)
	key := lockhooks.LockID("lockdemo/showcase")
	for round := 1; ctx.Err() == nil; round++ {
		held, err := lockhooks.AcquireAdvisoryLock(ctx, db, key)
		if err != nil {
			break
		}
		var wg sync.WaitGroup
		wg.Go(func() { // waits for the advisory lock
			if l, err := lockhooks.AcquireAdvisoryLock(ctx, db, key); err == nil {
				l.Release(context.Background())
			}
		})
		tx, err := d.showcaseTx(ctx, db)
		if err == nil && lockhooks.Lock(ctx, tx, "orders", round%5) == nil {
			wg.Go(func() { // waits for the lockset id
				if other, err := d.showcaseTx(ctx, db); err == nil {
					lockhooks.Lock(ctx, other, "orders", round%5)
					other.Rollback()
				}
			})
		}
		select {
		case <-ctx.Done():
		case <-time.After(4 * time.Second):
		}
		if tx != nil {
			tx.Rollback()
		}
		held.Release(context.Background())
		wg.Wait()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	if errors.Is(ctx.Err(), context.Canceled) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil
	}
	return ctx.Err()
}

// showcaseTx begins a transaction for Lock: read-only on SQLite, so that
// two can be open at once (write transactions queue for the writer lock).
func (d *demo) showcaseTx(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, &sql.TxOptions{ReadOnly: !d.postgres()})
}

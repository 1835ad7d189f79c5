// Command lockdemo shows, side by side, what goes wrong with a raw
// database/sql driver and what lockhooks fixes.
//
//	go run ./cmd/lockdemo                      # embedded SQLite in a temp dir, no server needed
//	go run ./cmd/lockdemo -postgres DSN        # the same against PostgreSQL
//	go run ./cmd/lockdemo -trace-out spans.jsonl -otlp localhost:4318
//	go run ./cmd/lockdemo -serve :8080         # serve lockhooks.DebugHandler at /debug/locks and metrics at /metrics meanwhile
//
// It exits with status 0 only if every lockhooks column shows the promised
// result.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// config is the demo's command line.
type config struct {
	postgres  string
	workers   int
	transfers int
	traceOut  string
	otlp      string
	serve     string
	serveFor  time.Duration
}

func run(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("lockdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.postgres, "postgres", "", "run against this PostgreSQL DSN (postgres://…) instead of an embedded SQLite file")
	fs.IntVar(&cfg.workers, "workers", 8, "concurrent workers in the bank-transfer scenario")
	fs.IntVar(&cfg.transfers, "transfers", 200, "transfers per worker in the bank-transfer scenario")
	fs.StringVar(&cfg.traceOut, "trace-out", "", "write lockhooks' spans to this file as JSON lines")
	fs.StringVar(&cfg.otlp, "otlp", "", "also export lockhooks' spans to this OTLP/HTTP endpoint (host:port)")
	fs.StringVar(&cfg.serve, "serve", "", "serve the live lock page (lockhooks.DebugHandler) at /debug/locks and lockhooks' metrics for Prometheus at /metrics on this address, e.g. :8080, while the scenarios run and afterwards until interrupted")
	fs.DurationVar(&cfg.serveFor, "serve-for", 0, "with -serve: stop serving after this long instead of at an interrupt")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: lockdemo [flags]\n\nRuns locking scenarios twice, on the raw driver and through lockhooks, and prints what each got.\nWithout -postgres it uses an embedded SQLite file in a temporary directory.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tel, err := newTelemetry(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "lockdemo:", err)
		return 1
	}
	defer tel.shutdown(context.Background())

	d := &demo{cfg: cfg, out: stdout, tel: tel}
	if cfg.serve != "" {
		url, stop, err := d.serve(cfg.serve)
		if err != nil {
			fmt.Fprintln(stderr, "lockdemo:", err)
			return 1
		}
		defer stop()
		fmt.Fprintf(stdout, "Live lock page: %s\nPrometheus metrics: %s\n\n", url, strings.TrimSuffix(url, debugPath)+metricsPath)
	}
	if cfg.postgres == "" {
		dir, err := os.MkdirTemp("", "lockdemo-")
		if err != nil {
			fmt.Fprintln(stderr, "lockdemo:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		d.sqlitePath = filepath.Join(dir, "demo.db")
		fmt.Fprintf(stdout, "lockhooks demo on SQLite (%s)\n\n", d.sqlitePath)
	} else {
		fmt.Fprintf(stdout, "lockhooks demo on PostgreSQL\n\n")
	}

	var results []result
	for _, scenario := range []func(context.Context) result{d.bankTransfers, d.advisoryLeak, d.foreignKeys} {
		start := time.Now()
		r := scenario(ctx)
		if r.skipped == "" {
			fmt.Fprintf(stdout, "  (%v)\n", time.Since(start).Round(time.Millisecond))
		}
		results = append(results, r)
	}
	d.slowestWaits()

	fmt.Fprintf(stdout, "\n%-34s %-34s %-34s %s\n", "scenario", "raw driver", "lockhooks", "promise kept")
	ok := true
	for _, r := range results {
		kept := "yes"
		switch {
		case r.skipped != "":
			kept = "skipped: " + r.skipped
		case r.err != nil:
			kept, ok = "NO: "+r.err.Error(), false
		case !r.kept:
			kept, ok = "NO", false
		}
		fmt.Fprintf(stdout, "%-34s %-34s %-34s %s\n", r.name, r.raw, r.wrapped, kept)
	}
	if !ok {
		fmt.Fprintln(stdout, "\nlockhooks did not keep every promise.")
	} else {
		fmt.Fprintln(stdout, "\nEvery lockhooks column shows the promised result.")
	}
	if cfg.serve != "" {
		d.keepServing(stdout, stderr)
	}
	if !ok {
		return 1
	}
	return 0
}

// keepServing runs the showcase, for the live page, until an interrupt or
// -serve-for.
func (d *demo) keepServing(stdout, stderr io.Writer) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	until := "until interrupted (Ctrl-C)"
	if d.cfg.serveFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.cfg.serveFor)
		defer cancel()
		until = "for " + d.cfg.serveFor.String()
	}
	fmt.Fprintf(stdout, "\nServing the live lock page %s; a showcase holds a lock and waits for it every few seconds.\n", until)
	if err := d.showcase(ctx); err != nil {
		fmt.Fprintln(stderr, "lockdemo: showcase:", err)
	}
}

// result is one scenario's row in the final table.
type result struct {
	name         string
	raw, wrapped string
	kept         bool   // the lockhooks column shows the promised result
	skipped      string // why the scenario did not run
	err          error
}

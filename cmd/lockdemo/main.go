// Command lockdemo shows, side by side, what goes wrong with a raw
// database/sql driver and what lockhooks fixes.
//
//	go run ./cmd/lockdemo                      # embedded SQLite in a temp dir, no server needed
//	go run ./cmd/lockdemo -postgres DSN        # the same against PostgreSQL
//	go run ./cmd/lockdemo -trace-out spans.jsonl -otlp localhost:4318
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
	"path/filepath"
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
		return 1
	}
	fmt.Fprintln(stdout, "\nEvery lockhooks column shows the promised result.")
	return 0
}

// result is one scenario's row in the final table.
type result struct {
	name         string
	raw, wrapped string
	kept         bool   // the lockhooks column shows the promised result
	skipped      string // why the scenario did not run
	err          error
}

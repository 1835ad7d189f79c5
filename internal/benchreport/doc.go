// Command benchreport runs lockhooks' benchmarks and writes BENCHMARKS.md
// from their output, so every figure there comes from one command:
//
//	go run ./internal/benchreport            # from the module root, on a quiet machine
//	go run ./internal/benchreport -count 10  # more runs for tighter intervals
//
// It needs PostgreSQL's server binaries, as the tests do, and runs
// benchstat (golang.org/x/perf) through `go run`. The raw/lockhooks/otelsql
// comparison runs in the integration module (go -C integration), which
// requires otelsql so that the library's go.mod does not.
//
// It imports nothing of lockhooks' (it runs `go test -bench` as a command).
package main

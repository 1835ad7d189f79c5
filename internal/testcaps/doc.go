// Package testcaps knows what lockhooks' tests need from the machine
// (PostgreSQL, PgBouncer, Chromium, Prometheus), skips a test loudly when
// one is missing (or fails it when its LOCKHOOKS_REQUIRE_* variable is 1),
// and reports what a package's run did not test in a way `go test` shows.
//
// `go test ./...` without -v prints only "ok" for a package that passed:
// the output of its tests, skip messages included, is dropped. So [Main]
// (and pgtest.Main, which calls [Report]) writes the report to where the
// go command itself writes: its standard output when that is a terminal
// or a pipe (found through /proc on Linux), else the terminal (/dev/tty),
// else the test's own standard output. With -v or -json the report is
// ordinary test output. A cached result ("(cached)") runs nothing and so
// reports nothing: -count=1 runs the tests again.
//
// It owns the list of what a run skipped. It imports nothing of lockhooks'.
// Only tests (and internal/pgtest) import it.
package testcaps

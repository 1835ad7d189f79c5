// Package bench holds the benchmarks that compare a statement through the
// raw driver, through lockhooks and through XSAM/otelsql (the usual
// database/sql instrumentation). They live in the integration module so that
// the library's go.mod does not require otelsql; internal/benchreport runs
// them for BENCHMARKS.md.
package bench

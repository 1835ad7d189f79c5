// Package telemetry is lockhooks' OpenTelemetry output for one wrapped
// database: its tracer and instruments ([Set]: the wait and hold
// histograms, the counters of lost locks, rerouted and refused unlocks,
// deadlocks, lock timeouts and serialization failures, the gauges of held
// locks and parked connections), the span and histogram of one lock wait
// ([Wait]: started where a lock is asked for, named after its holders,
// ended with its outcome, or recorded at its end as a trace of its own when
// it lasted long outside a trace), a statement's client span, and the span
// attributes of a holder and of the blockers the server showed.
//
// It formats what the model of holders says (values of package
// internal/holders) and never decides who holds what: the caller names the
// holders, the lock's keys and the statement's span name. It owns the
// instruments it creates and each Wait's span; nothing is global (the
// providers come from the caller, or otel's global ones, as the caller
// chooses).
//
// It may import internal/holders and internal/dberr (a failure's SQLSTATE
// is its status code), never the SQL scanner, a driver-level package or
// the session-lock machinery.
package telemetry

package lockhooks

import "github.com/lockhooks/lockhooks/internal/keynames"

// Names of advisory-lock keys. An advisory key is a number; the name it
// was made from is what a reader knows. [LockID] remembers the names it
// hashed, and Lock on Postgres the (namespace, id) each of its keys was
// derived from, so that the debug page, its JSON, the slow-wait log,
// errors and spans show "nightly-report (4290127349813372591)" instead
// of the bare number. describeKey is the one function that formats a key
// for a reader; call it (or lockKey.String) wherever a key is shown.

// keyNames is the process-wide memory of key names (internal/keynames).
// It is the package's one piece of global mutable state beyond what
// sql.Register forces: LockID sees no database, so its names cannot live
// in one. It is bounded (keynames.Capacity), holds only names (never
// arguments or statement text), and costs LockID a read-locked map lookup
// when the name is already known, one insertion when it is not.
var keyNames keynames.Memory

// describeKey formats advisory key k for a reader: "name (k)" when
// lockhooks knows the name it was made from (LockID's argument, or Lock's
// "namespace / id"), else the number alone. Every place that shows a key
// (the debug page and its JSON, the slow-wait log, errors, events, span
// attributes) formats it here.
func describeKey(k int64) string { return keyNames.Describe(k) }

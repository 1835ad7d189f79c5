// Package keynames remembers the names advisory-lock keys were made from,
// so that a key is shown to a reader by its name: "nightly-report
// (4290127349813372591)" instead of the bare number.
//
// Its one job: a bounded memory of names by key ([Memory]: two
// generations of at most [Capacity] keys, names truncated to [MaxLen]),
// what a key was made from ([Origin]: a name given to LockID, or the
// namespace and id of a lockset key on Postgres), and the one format of
// a key for a reader ([Memory.Describe]).
//
// State: a Memory's names, guarded by its mutex. The package holds no
// memory of its own: the one the root keeps for LockID is the library's
// one piece of process-wide state beyond what sql.Register forces (LockID
// sees no database).
//
// Imports: internal/holders (truncation, as every consumer bounds text)
// and internal/lockset (what a lockset key's name holds).
package keynames

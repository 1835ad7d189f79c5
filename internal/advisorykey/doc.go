// Package advisorykey names one Postgres advisory lock as lockhooks tracks
// it: a bigint key or a pair of int4 keys (separate key spaces), in shared
// or exclusive mode, how pg_locks shows it (classid, objid, objsubid), and
// the token an identity names it by ([Key.Token]: 42, 1/2, 42-shared);
// and, for generic code keyed by a caller's own key type, the constraints
// [Typed] and [Named] and the key in exclusive mode as that type
// ([Exclusive]).
//
// State: none; a [Key] is a comparable value, used as a map key.
//
// Imports: nothing of ours (and not database/sql or its driver package:
// the statements that take and release a key are built by the caller).
package advisorykey

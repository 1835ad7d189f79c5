// Package lockset is the request of lockhooks' Lock and TryLock: a
// namespace and ids, put in the one canonical order every transaction takes
// them in (integers numerically, then strings and fmt.Stringers bytewise,
// then 16-byte UUIDs), encoded so that byte order is that order
// ([CanonicalIDs]), carried through the driver as one argument ([Encode],
// [Decode]) and named again for messages ([DescribeID]); and, on Postgres,
// the transaction-level advisory keys the ids become and the one statement
// that takes them in order ([AdvisoryKeys], [Statement]).
//
// It owns no state: the in-process locks of SQLite are internal/sqlitelock's
// table, the Postgres keys are the server's. Pure: it imports nothing of
// lockhooks' and no driver-level package.
package lockset

package advisorykey

import "strconv"

// Key identifies one advisory lock: a bigint key or a pair of int4 keys
// (separate key spaces), in exclusive or shared mode. It is comparable;
// two Keys are equal when they name the same lock in the same mode.
type Key struct {
	Pair   bool  // the key is a pair of int4 keys, not one bigint
	K1     int64 // the bigint key, or the first int4 key
	K2     int64 // the second int4 key
	Shared bool  // shared mode, not exclusive
}

// Typed is the type set of [Key] and of the types defined over it (a
// caller's key type that names a key its own way): generic code keyed by
// any of them converts a key to Key and back for free.
type Typed interface {
	~struct {
		Pair   bool
		K1     int64
		K2     int64
		Shared bool
	}
}

// Named is a [Typed] key type that names its keys for a reader (the
// caller's own String: a bigint key by the name it was made from, say).
type Named interface {
	Typed
	String() string
}

// Exclusive returns k in exclusive mode, as k's own type.
func Exclusive[K Typed](k K) K { return K(Key(k).Exclusive()) }

// String formats k as Postgres shows it, followed by " (shared)" for a
// shared key: "42", "(1, 2) (shared)".
func (k Key) String() string { return k.Describe(formatInt) }

// Describe formats k for a reader, as String does, but with a bigint key
// formatted by bigint (which may add the name the key was made from); an
// int4 pair is always shown as its two numbers.
func (k Key) Describe(bigint func(int64) string) string {
	var s string
	if k.Pair {
		s = k.Number()
	} else {
		s = bigint(k.K1)
	}
	if k.Shared {
		s += " (shared)"
	}
	return s
}

// Number formats k as Postgres shows it, without a name or mode: "42" or
// "(1, 2)".
func (k Key) Number() string {
	if k.Pair {
		return "(" + strconv.FormatInt(k.K1, 10) + ", " + strconv.FormatInt(k.K2, 10) + ")"
	}
	return strconv.FormatInt(k.K1, 10)
}

// Exclusive returns k in exclusive mode.
func (k Key) Exclusive() Key { k.Shared = false; return k }

// SharedMode returns k in shared mode.
func (k Key) SharedMode() Key { k.Shared = true; return k }

// FromLocks names the advisory lock of a pg_locks row from its classid,
// objid and objsubid columns: objsubid 2 is an int4 pair (classid and
// objid, each the bits of one int4), any other a bigint key whose high
// half is classid and low half objid. shared is whether the row's mode is
// ShareLock.
func FromLocks(classid, objid, objsubid int64, shared bool) Key {
	k := Key{Shared: shared}
	if objsubid == 2 {
		k.Pair, k.K1, k.K2 = true, int64(int32(uint32(classid))), int64(int32(uint32(objid)))
	} else {
		k.K1 = classid<<32 | objid
	}
	return k
}

// LocksID is where a pg_locks row shows k: its classid, objid and objsubid
// ([FromLocks] reads them back).
func (k Key) LocksID() (classid, objid int64, objsubid int) {
	if k.Pair {
		return int64(uint32(int32(k.K1))), int64(uint32(int32(k.K2))), 2
	}
	return int64(uint64(k.K1) >> 32), k.K1 & 0xffffffff, 1
}

// formatInt formats n in decimal.
func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

package advisorykey

import (
	"math"
	"testing"
)

// TestString checks how a key reads: a bigint key (positive, negative,
// the extremes), an int4 pair, and either in shared mode.
func TestString(t *testing.T) {
	for _, c := range []struct {
		k    Key
		want string
	}{
		{Key{K1: 42}, "42"},
		{Key{K1: -7}, "-7"},
		{Key{K1: math.MinInt64}, "-9223372036854775808"},
		{Key{K1: math.MaxInt64, Shared: true}, "9223372036854775807 (shared)"},
		{Key{Pair: true, K1: 1, K2: 2}, "(1, 2)"},
		{Key{Pair: true, K1: -1, K2: math.MinInt32, Shared: true}, "(-1, -2147483648) (shared)"},
		{Key{K1: 5, Shared: true}, "5 (shared)"},
	} {
		if got := c.k.String(); got != c.want {
			t.Errorf("%#v.String() = %q, want %q", c.k, got, c.want)
		}
	}
}

// TestDescribe checks that a bigint key is named by the caller's function
// and an int4 pair never is, the mode suffix kept either way.
func TestDescribe(t *testing.T) {
	name := func(n int64) string { return "nightly (" + Key{K1: n}.Number() + ")" }
	for _, c := range []struct {
		k    Key
		want string
	}{
		{Key{K1: 42}, "nightly (42)"},
		{Key{K1: 42, Shared: true}, "nightly (42) (shared)"},
		{Key{Pair: true, K1: 3, K2: 4}, "(3, 4)"},
		{Key{Pair: true, K1: 3, K2: 4, Shared: true}, "(3, 4) (shared)"},
	} {
		if got := c.k.Describe(name); got != c.want {
			t.Errorf("%#v.Describe = %q, want %q", c.k, got, c.want)
		}
	}
}

// TestNumber checks the number alone: no mode, no name.
func TestNumber(t *testing.T) {
	if got := (Key{K1: -42, Shared: true}).Number(); got != "-42" {
		t.Errorf("Number of shared -42 = %q", got)
	}
	if got := (Key{Pair: true, K1: 1, K2: -2, Shared: true}).Number(); got != "(1, -2)" {
		t.Errorf("Number of shared (1, -2) = %q", got)
	}
}

// TestExclusive checks that Exclusive clears the mode only (and
// SharedMode sets it only), and that the
// shared and exclusive forms of one key are distinct map keys.
func TestExclusive(t *testing.T) {
	sh := Key{Pair: true, K1: 1, K2: 2, Shared: true}
	ex := sh.Exclusive()
	if ex != (Key{Pair: true, K1: 1, K2: 2}) {
		t.Errorf("Exclusive of %v = %#v", sh, ex)
	}
	if ex.Exclusive() != ex {
		t.Errorf("Exclusive of an exclusive key changed it: %#v", ex.Exclusive())
	}
	if ex.SharedMode() != sh || sh.SharedMode() != sh {
		t.Errorf("SharedMode of %v = %#v, of %v = %#v; want %#v", ex, ex.SharedMode(), sh, sh.SharedMode(), sh)
	}
	m := map[Key]bool{sh: true, ex: true}
	if len(m) != 2 {
		t.Errorf("shared and exclusive forms of one key collide as map keys")
	}
	if (Key{K1: 1, K2: 2}) == (Key{Pair: true, K1: 1, K2: 2}) {
		t.Errorf("a bigint key equals an int4 pair")
	}
}

// TestFromLocks checks the conversion from pg_locks' columns, which show
// a bigint key as its high half (classid) and low half (objid), each an
// unsigned 32-bit oid, with objsubid 1, and an int4 pair as the bits of
// each int4 in classid and objid with objsubid 2.
func TestFromLocks(t *testing.T) {
	// split returns what pg_locks shows for bigint key n.
	split := func(n int64) (int64, int64) { return int64(uint64(n) >> 32), int64(uint32(n)) }
	for _, n := range []int64{0, 1, 42, -1, -42, 1 << 32, -(1 << 32), math.MinInt64, math.MaxInt64, 4290127349813372591} {
		classid, objid := split(n)
		if got, want := FromLocks(classid, objid, 1, false), (Key{K1: n}); got != want {
			t.Errorf("FromLocks(%d, %d, 1) = %#v, want %#v", classid, objid, got, want)
		}
		if c, o, sub := (Key{K1: n}).LocksID(); c != classid || o != objid || sub != 1 {
			t.Errorf("Key{K1: %d}.LocksID() = %d, %d, %d; want %d, %d, 1", n, c, o, sub, classid, objid)
		}
		if got, want := FromLocks(classid, objid, 1, true), (Key{K1: n, Shared: true}); got != want {
			t.Errorf("FromLocks(%d, %d, 1, shared) = %#v, want %#v", classid, objid, got, want)
		}
	}
	for _, p := range [][2]int32{{0, 0}, {1, 2}, {-1, -2}, {math.MinInt32, math.MaxInt32}, {-7, 7}} {
		// pg_locks shows an int4 as an oid: its bits, unsigned.
		classid, objid := int64(uint32(p[0])), int64(uint32(p[1]))
		want := Key{Pair: true, K1: int64(p[0]), K2: int64(p[1]), Shared: true}
		if c, o, sub := want.LocksID(); c != classid || o != objid || sub != 2 {
			t.Errorf("%#v.LocksID() = %d, %d, %d; want %d, %d, 2", want, c, o, sub, classid, objid)
		}
		if got := FromLocks(classid, objid, 2, true); got != want {
			t.Errorf("FromLocks(%d, %d, 2) = %#v, want %#v (sign-extended)", classid, objid, got, want)
		}
	}
	if got := FromLocks(4294967295, 4294967254, 2, false).String(); got != "(-1, -42)" {
		t.Errorf("the pair (-1, -42) from pg_locks reads %q", got)
	}
	if got := FromLocks(4294967295, 4294967254, 1, false).String(); got != "-42" {
		t.Errorf("the bigint -42 from pg_locks reads %q", got)
	}
}

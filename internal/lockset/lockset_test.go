package lockset

import (
	"slices"
	"strings"
	"testing"
)

type stringer string

func (s stringer) String() string { return string(s) }

func TestCanonicalIDOrder(t *testing.T) {
	uuidA, uuidB := [16]byte{1}, [16]byte{2}
	keys, err := CanonicalIDs([]any{"b", uuidB, int64(10), -3, "a", uuidA, stringer("c"), uint8(2), 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, DescribeID(k))
		if !ValidID(k) {
			t.Errorf("%q is not a valid canonical id", k)
		}
	}
	want := `-3 2 10 "a" "b" "c" 01000000000000000000000000000000 02000000000000000000000000000000`
	if s := strings.Join(got, " "); s != want {
		t.Errorf("order %s\n want %s", s, want)
	}
	if _, err := CanonicalIDs([]any{3.5}); err == nil || !strings.Contains(err.Error(), "float64") {
		t.Errorf("a float id: %v", err)
	}
	if _, err := CanonicalIDs([]any{uint64(1) << 63}); err == nil || !strings.Contains(err.Error(), "does not fit an int64") {
		t.Errorf("an id too large for int64: %v", err)
	}
	if _, err := CanonicalIDs(nil); err == nil {
		t.Error("no ids accepted")
	}
}

// Statement takes the keys in the order given, as a target list or, for
// more keys than a target list may hold, through unnest.
func TestStatement(t *testing.T) {
	if got := Statement("pg_advisory_xact_lock", "count", []int64{3, 7}); got != "SELECT pg_advisory_xact_lock(3), pg_advisory_xact_lock(7)" {
		t.Errorf("two keys: %q", got)
	}
	many := make([]int64, maxTargetCalls+1)
	for i := range many {
		many[i] = int64(i)
	}
	if got := Statement("pg_advisory_xact_lock", "count", many); !strings.HasPrefix(got, "SELECT count(pg_advisory_xact_lock(k)) FROM unnest('{0,1,2,") || !strings.HasSuffix(got, ",1000}'::bigint[]) AS k") {
		t.Errorf("%d keys: %.80q…", len(many), got)
	}
}

// Decode never panics, and what it decodes Encode writes back to bytes
// that decode the same.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(Encode("invoices", []string{IntID(7), "sabc"}, true)))
	f.Add([]byte(Encode("", nil, false)))
	f.Add([]byte{})
	f.Add([]byte{1, 200})
	f.Fuzz(func(t *testing.T, b []byte) {
		namespace, ids, try, err := Decode(b)
		if err != nil {
			return
		}
		again := Encode(namespace, ids, try)
		n2, ids2, try2, err := Decode(again)
		if err != nil || n2 != namespace || !slices.Equal(ids2, ids) || try2 != try {
			t.Fatalf("Decode(Encode(%q, %q, %v)) = %q, %q, %v, %v", namespace, ids, try, n2, ids2, try2, err)
		}
	})
}

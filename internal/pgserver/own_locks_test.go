package pgserver

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

// ownLocksRow writes the row the server answers AppendOwnLocksQuery with.
func ownLocksRow(pid int32, marker string, keys ...advisorykey.Key) string {
	var b strings.Builder
	fmt.Fprint(&b, pid)
	for _, k := range keys {
		classid, objid, sub := k.LocksID()
		mode := "x"
		if k.Shared {
			mode = "s"
		}
		fmt.Fprintf(&b, " %d %d %d%s", classid, objid, sub, mode)
	}
	return b.String() + "|" + marker
}

func TestParseOwnLocks(t *testing.T) {
	keys := []advisorykey.Key{{K1: 42}, {K1: -7, Shared: true}, {Pair: true, K1: 1, K2: 2}}
	var got []advisorykey.Key
	ranOn, marker, err := ParseOwnLocks(ownLocksRow(901, "ab12:3", keys...), func(k advisorykey.Key) { got = append(got, k) })
	if err != nil || ranOn != 901 || marker != "ab12:3" || fmt.Sprint(got) != fmt.Sprint(keys) {
		t.Fatalf("parsed %v on %d marker %q (%v), want %v on 901 marker ab12:3", got, ranOn, marker, err, keys)
	}
	for _, bad := range []string{"", "901", "x|", "901 1 2|", "901 1 2 3|", "901 1 2 3q|"} {
		if _, _, err := ParseOwnLocks(bad, func(advisorykey.Key) {}); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// ParseOwnLocks never panics, and reads back the keys of a row written
// from the keys it parsed.
func FuzzParseOwnLocks(f *testing.F) {
	f.Add(ownLocksRow(901, "", advisorykey.Key{K1: 42}))
	f.Add(ownLocksRow(1, "m", advisorykey.Key{K1: 1, Shared: true}, advisorykey.Key{Pair: true, K1: 3, K2: 4}))
	f.Add("901 1 2 3x 4|")
	f.Fuzz(func(t *testing.T, row string) {
		var keys []advisorykey.Key
		ranOn, marker, err := ParseOwnLocks(row, func(k advisorykey.Key) { keys = append(keys, k) })
		if err != nil {
			return
		}
		var again []advisorykey.Key
		ranOn2, marker2, err := ParseOwnLocks(ownLocksRow(ranOn, marker, keys...), func(k advisorykey.Key) { again = append(again, k) })
		if err != nil || ranOn2 != ranOn || marker2 != marker || fmt.Sprint(again) != fmt.Sprint(keys) {
			t.Fatalf("%q: parsed %v on %d; written back and parsed: %v on %d (%v)", row, keys, ranOn, again, ranOn2, err)
		}
	})
}

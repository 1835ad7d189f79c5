package lockhooks

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/lockset"
)

// LockID remembers the names it hashed, and every place that shows a key
// formats it by name; Lock's keys show as its namespace and id.
func TestKeyNames(t *testing.T) {
	k := LockID("nightly-report")
	if got, want := describeKey(k), "nightly-report ("+strconv.FormatInt(k, 10)+")"; got != want {
		t.Errorf("describeKey = %q, want %q", got, want)
	}
	if got := (lockKey{K1: k, Shared: true}).String(); !strings.HasPrefix(got, "nightly-report (") || !strings.HasSuffix(got, " (shared)") {
		t.Errorf("lockKey.String = %q", got)
	}
	if got := (lockKey{K1: k}).number(); got != strconv.FormatInt(k, 10) {
		t.Errorf("number = %q", got)
	}
	if got := describeKey(42); got != "42" {
		t.Errorf("an unnamed key: %q", got)
	}
	for _, c := range []struct {
		id   any
		want string
	}{{42, "invoices / 42"}, {"a/b", `invoices / "a/b"`}, {[16]byte{1}, "invoices / 01000000000000000000000000000000"}} {
		ids, err := lockset.CanonicalIDs([]any{c.id})
		if err != nil {
			t.Fatal(err)
		}
		key := lockset.AdvisoryKeys("invoices", ids, LockID)[0]
		o, ok := originOf(key)
		if !ok || !o.lockset || o.namespace != "invoices" || o.label() != c.want {
			t.Errorf("Lock(%v): origin %+v %v, label %q, want %q", c.id, o, ok, o.label(), c.want)
		}
	}
	// Known names cost LockID no allocation.
	if n := testing.AllocsPerRun(100, func() { LockID("nightly-report") }); n != 0 {
		t.Errorf("LockID of a known name allocates %v times", n)
	}
}

// The memory is bounded: two generations; a name in use stays known.
func TestKeyNamesBounded(t *testing.T) {
	var m nameMemory
	m.remember(1, "kept")
	for i := range 3 * keyNameCapacity {
		m.remember(int64(1000+i), fmt.Sprint("n", i))
		if i%1000 == 0 {
			m.remember(1, "kept") // in use: copied forward
		}
	}
	if len(m.cur)+len(m.old) > 2*keyNameCapacity {
		t.Errorf("%d names remembered, want at most %d", len(m.cur)+len(m.old), 2*keyNameCapacity)
	}
	if name, ok := m.lookup(1); !ok || name != "kept" {
		t.Errorf("a name in use was forgotten")
	}
	if _, ok := m.lookup(1000); ok {
		t.Errorf("an old name was kept")
	}
	m.remember(2, strings.Repeat("x", 10*keyNameMaxLen))
	if name, _ := m.lookup(2); len(name) > keyNameMaxLen+len("…") {
		t.Errorf("a long name is kept whole (%d bytes)", len(name))
	}
}

package keynames

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/lockset"
)

// The memory is bounded: two generations; a name in use stays known.
func TestMemoryIsBounded(t *testing.T) {
	var m Memory
	m.Remember(1, "kept")
	for i := range 3 * Capacity {
		m.Remember(int64(1000+i), fmt.Sprint("n", i))
		if i%1000 == 0 {
			m.Remember(1, "kept") // in use: copied forward
		}
	}
	if len(m.cur)+len(m.old) > 2*Capacity {
		t.Errorf("%d names remembered, want at most %d", len(m.cur)+len(m.old), 2*Capacity)
	}
	if name, ok := m.Lookup(1); !ok || name != "kept" {
		t.Errorf("a name in use was forgotten")
	}
	if _, ok := m.Lookup(1000); ok {
		t.Errorf("an old name was kept")
	}
	m.Remember(2, strings.Repeat("x", 10*MaxLen))
	if name, _ := m.Lookup(2); len(name) > MaxLen+len("…") {
		t.Errorf("a long name is kept whole (%d bytes)", len(name))
	}
}

// A key is described by its name, a lockset's by namespace and id, an
// unknown one by its number.
func TestDescribe(t *testing.T) {
	var m Memory
	m.Remember(7, "nightly-report")
	if got := m.Describe(7); got != "nightly-report (7)" {
		t.Errorf("Describe(7) = %q", got)
	}
	if got := m.Describe(42); got != "42" {
		t.Errorf("an unnamed key: %q", got)
	}
	ids, err := lockset.CanonicalIDs([]any{"a/b"})
	if err != nil {
		t.Fatal(err)
	}
	m.Remember(9, "invoices\x00"+ids[0])
	if o, ok := m.Origin(9); !ok || !o.Lockset || o.Namespace != "invoices" || o.Label() != `invoices / "a/b"` {
		t.Errorf("a lockset key's origin: %+v %v, label %q", o, ok, o.Label())
	}
}

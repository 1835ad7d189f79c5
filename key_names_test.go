package lockhooks

import (
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
		o, ok := keyNames.Origin(key)
		if !ok || !o.Lockset || o.Namespace != "invoices" || o.Label() != c.want {
			t.Errorf("Lock(%v): origin %+v %v, label %q, want %q", c.id, o, ok, o.Label(), c.want)
		}
	}
	// Known names cost LockID no allocation.
	if n := testing.AllocsPerRun(100, func() { LockID("nightly-report") }); n != 0 {
		t.Errorf("LockID of a known name allocates %v times", n)
	}
}

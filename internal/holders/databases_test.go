package holders

import (
	"fmt"
	"testing"
)

// Databases are numbered in order, default names made unique, a name the
// user gave kept (and a clash reported), and a database that left frees
// its name.
func TestDatabases(t *testing.T) {
	var r Databases[int]
	type joined struct {
		seq   uint64
		pool  string
		clash bool
	}
	join := func(d int, name string, explicit bool) (j joined) {
		j.clash = r.Join(d, name, explicit, func(seq uint64, pool string) { j.seq, j.pool = seq, pool })
		return j
	}
	if got := join(1, "db:5432/app", false); got != (joined{1, "db:5432/app", false}) {
		t.Errorf("first: %+v", got)
	}
	if got := join(2, "db:5432/app", false); got != (joined{2, "db:5432/app#2", false}) {
		t.Errorf("a second on the same DSN: %+v", got)
	}
	if got := join(3, "db:5432/app", true); got != (joined{3, "db:5432/app", true}) {
		t.Errorf("a name the user gave that another has: %+v", got)
	}
	r.Leave(2)
	if got := join(4, "db:5432/app", false); got.pool != "db:5432/app#2" || got.seq != 4 {
		t.Errorf("after #2 left: %+v", got)
	}
	if got := fmt.Sprint(r.List()); got != "[1 3 4]" {
		t.Errorf("listed %s, want [1 3 4]", got)
	}
}

// The registry lists at most MaxDatabases; the rest are numbered and
// named but not listed.
func TestDatabasesBounded(t *testing.T) {
	var r Databases[int]
	for i := range MaxDatabases + 3 {
		r.Join(i, fmt.Sprint("db", i), false, func(uint64, string) {})
	}
	if n := len(r.List()); n != MaxDatabases {
		t.Errorf("%d listed, want %d", n, MaxDatabases)
	}
	var seq uint64
	r.Join(-1, "db", false, func(n uint64, _ string) { seq = n })
	if seq != MaxDatabases+4 {
		t.Errorf("seq %d, want %d", seq, MaxDatabases+4)
	}
}

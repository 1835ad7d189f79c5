package stmtlocks

import (
	"database/sql/driver"
	"slices"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// keysOf is each call's key, known where it is a literal.
func keysOf(adv *sqlscan.Advisory) ([]advisorykey.Key, []bool) {
	keys, known := make([]advisorykey.Key, len(adv.Calls)), make([]bool, len(adv.Calls))
	for i, call := range adv.Calls {
		keys[i], known[i] = KeyOf(call, nil)
	}
	return keys, known
}

func TestAdvisoryWait(t *testing.T) {
	for _, c := range []struct {
		text, mode, scope, keys string
		resolved                []int64
		ok                      bool
	}{
		{"SELECT pg_advisory_lock(7)", "exclusive", "session", "7", []int64{7}, true},
		{"SELECT pg_try_advisory_lock_shared(7)", "shared", "session", "7 (shared)", []int64{7}, true},
		{"SELECT pg_advisory_xact_lock(1, 2)", "exclusive", "transaction", "(1, 2)", []int64{1}, true},
		{"SELECT pg_advisory_unlock(7), pg_advisory_lock(8), pg_advisory_lock_shared(9)", "exclusive", "session", "8, 9 (shared)", []int64{8, 9}, true},
		{"SELECT pg_advisory_lock(id) FROM jobs", "exclusive", "session", "expression", nil, true},
		{"SELECT pg_advisory_unlock(7), pg_advisory_unlock_all()", "", "", "", nil, false},
	} {
		adv := sqlscan.ParseAdvisory(c.text)
		keys, known := keysOf(&adv)
		mode, scope, text, resolved, ok := AdvisoryWait(&adv, keys, known)
		var ids []int64
		for _, k := range resolved {
			ids = append(ids, k.K1)
		}
		if mode != c.mode || scope != c.scope || text != c.keys || !slices.Equal(ids, c.resolved) || ok != c.ok {
			t.Errorf("%s: %q %q %q %v %v, want %q %q %q, keys %v, %v", c.text, mode, scope, text, resolved, ok, c.mode, c.scope, c.keys, c.resolved, c.ok)
		}
	}
}

// A single call's keys are the caller's own slice, capped: no allocation.
func TestAdvisoryWaitOneCallAllocatesNothing(t *testing.T) {
	adv := sqlscan.ParseAdvisory("SELECT pg_advisory_lock(7)")
	keys, known := keysOf(&adv)
	_, _, _, resolved, _ := AdvisoryWait(&adv, keys, known)
	if &resolved[0] != &keys[0] || cap(resolved) != 1 {
		t.Error("a single call's resolved keys are not the caller's slice")
	}
}

func TestWaiting(t *testing.T) {
	for _, c := range []struct {
		text string
		want []int64
	}{
		{"SELECT pg_advisory_lock(7)", []int64{7}},
		{"SELECT pg_try_advisory_lock(7)", nil},
		{"SELECT pg_advisory_unlock(7)", nil},
		{"SELECT pg_advisory_lock(7), pg_try_advisory_lock(8), pg_advisory_xact_lock_shared(9), pg_advisory_lock(id)", []int64{7, 9}},
	} {
		adv := sqlscan.ParseAdvisory(c.text)
		keys, known := keysOf(&adv)
		var got []int64
		for _, k := range Waiting(&adv, keys, known) {
			got = append(got, k.K1)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: waiting for %v, want %v", c.text, got, c.want)
		}
	}
}

func TestRowLockMode(t *testing.T) {
	for _, c := range []struct {
		locks   sqlscan.LockInfo
		rewrote bool
		want    string
	}{
		{sqlscan.ForUpdate, false, "for_update"},
		{sqlscan.ForUpdate, true, "for_no_key_update"},
		{sqlscan.ForNoKeyUpdate | sqlscan.ForShare, false, "for_no_key_update"},
		{sqlscan.ForShare | sqlscan.NoWait, false, "for_share"},
		{sqlscan.ForKeyShare, false, "for_key_share"},
	} {
		if got := RowLockMode(c.locks, c.rewrote); got != c.want {
			t.Errorf("RowLockMode(%v, %v) = %q, want %q", c.locks, c.rewrote, got, c.want)
		}
	}
}

func TestOneSessionLock(t *testing.T) {
	for text, want := range map[string]bool{
		"SELECT pg_advisory_lock(7)":                         true,
		"SELECT pg_try_advisory_lock(7)":                     true,
		"SELECT pg_advisory_lock_shared(7)":                  false,
		"SELECT pg_advisory_xact_lock(7)":                    false,
		"SELECT pg_advisory_unlock(7)":                       false,
		"SELECT pg_advisory_lock(7), pg_advisory_lock(8)":    false,
		"SELECT pg_advisory_lock(id) FROM jobs WHERE id = 1": false,
	} {
		adv := sqlscan.ParseAdvisory(text)
		if got := OneSessionLock(&adv); got != want {
			t.Errorf("%s: %v, want %v", text, got, want)
		}
	}
	if OneSessionLock(nil) {
		t.Error("no advisory call")
	}
}

func TestIntegerArgs(t *testing.T) {
	arg := func(v any) driver.NamedValue { return driver.NamedValue{Ordinal: 1, Value: v} }
	if !IntegerArgs(nil) || !IntegerArgs([]driver.NamedValue{arg(int64(7)), arg(int32(-1)), arg(uint8(3))}) {
		t.Error("integers that fit an int64")
	}
	for _, v := range []any{uint64(1 << 63), "7", []byte("7"), time.Now(), 7.0} {
		if IntegerArgs([]driver.NamedValue{arg(int64(1)), arg(v)}) {
			t.Errorf("%T %v is no integer that fits an int64", v, v)
		}
	}
}

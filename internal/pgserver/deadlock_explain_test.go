package pgserver

import (
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
)

func TestDescribeTarget(t *testing.T) {
	f := DeadlockFacts{Relations: map[string]string{"16384": "parent"}}
	key := func(k advisorykey.Key) string { return k.String() }
	for _, c := range []struct {
		e    DeadlockEdge
		held bool
		want string
	}{
		{DeadlockEdge{By: 902, Mode: "ShareLock", Target: "transaction 1234"}, false, "a row backend 902's transaction locked or changed (ShareLock on transaction 1234)"},
		{DeadlockEdge{By: 902, Mode: "ShareLock", Target: "transaction 1234"}, true, "rows its transaction locked or changed (transaction 1234)"},
		{DeadlockEdge{Mode: "ExclusiveLock", Target: "tuple (0,2) of relation 16384 of database 5"}, false, "row (0,2) of parent (ExclusiveLock)"},
		{DeadlockEdge{Mode: "AccessExclusiveLock", Target: "relation 99 of database 5"}, false, "table relation 99 (AccessExclusiveLock)"},
		{DeadlockEdge{Mode: "ExclusiveLock", Target: "advisory lock [5,0,7,1]"}, false, "advisory key 7"},
		{DeadlockEdge{Mode: "ShareLock", Target: "advisory lock [5,1,2,2]"}, false, "advisory key (1, 2) (shared)"},
		{DeadlockEdge{Mode: "ShareLock", Target: "virtual transaction 3/7"}, false, "ShareLock on virtual transaction 3/7"},
	} {
		if got := DescribeTarget(c.e, f, c.held, key); got != c.want {
			t.Errorf("DescribeTarget(%q, held %v) = %q, want %q", c.e.Target, c.held, got, c.want)
		}
	}
	e := DeadlockEdge{By: 902, Mode: "ShareLock", Target: "transaction 1234"}
	if got, ok := DescribeRowWait(e, `while locking tuple (0,2) in relation "parent"`); !ok || got != "row (0,2) of parent (locking it), which backend 902's transaction locked or changed (ShareLock on transaction 1234)" {
		t.Errorf("DescribeRowWait = %q, %v", got, ok)
	}
	if _, ok := DescribeRowWait(e, "SQL statement"); ok {
		t.Error("a CONTEXT naming no row was described")
	}
}

func TestDeadlockAdvice(t *testing.T) {
	rows := []DeadlockEdge{{Target: "transaction 1"}, {Target: "transaction 2"}}
	for _, c := range []struct {
		held, others []string
		where        string
		edges        []DeadlockEdge
		want         string
	}{
		{nil, nil, `SQL statement "SELECT 1 FROM ONLY "public"."parent" x WHERE "id" = $1 FOR KEY SHARE OF x"`, rows, "a foreign-key check"},
		{[]string{"rows of parent (FOR UPDATE)"}, []string{"INSERT INTO child VALUES (1)"}, "", rows, "a foreign-key check"},
		{[]string{"rows of parent (FOR UPDATE)"}, []string{"SELECT 1"}, "", rows, "locked the same rows in opposite orders"},
		{nil, nil, "", []DeadlockEdge{{Target: "advisory lock [5,0,7,1]"}, {Target: "advisory lock [5,0,8,1]"}}, "took advisory keys in opposite orders"},
		{nil, nil, "", []DeadlockEdge{{Target: "relation 5 of database 1"}, {Target: "transaction 2"}}, "take these locks in one order everywhere"},
	} {
		got := DeadlockAdvice(c.held, c.others, c.where, c.edges)
		if !strings.HasPrefix(got, c.want) && !strings.Contains(got, c.want) || !strings.HasSuffix(got, "retry the transaction (lockhooks.RunInTx does)") {
			t.Errorf("DeadlockAdvice(%v, %v, %q) = %q, want it to say %q", c.held, c.others, c.where, got, c.want)
		}
	}
}

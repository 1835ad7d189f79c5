package sqlscan

import (
	"reflect"
	"testing"
)

func TestParseAdvisory(t *testing.T) {
	lit := func(v int64) Arg { return Arg{Kind: ArgLiteral, Value: v} }
	par := func(n int) Arg { return Arg{Kind: ArgParam, Param: n} }
	expr := func(text string) Arg { return Arg{Kind: ArgExpr, Text: text} }
	one := func(col string, fn AdvisoryFunc, args ...Arg) Advisory {
		c := AdvisoryCall{Func: fn, NArgs: len(args), Column: col}
		copy(c.Args[:], args)
		return Advisory{Calls: []AdvisoryCall{c}, TargetList: true, Simple: true, Statements: 1}
	}
	cases := []struct {
		in   string
		want Advisory
	}{
		{`SELECT pg_advisory_lock(42)`, one("pg_advisory_lock", 0, lit(42))},
		{`select PG_ADVISORY_UNLOCK($1);`, one("pg_advisory_unlock", FnUnlock, par(1))},
		{`SELECT pg_catalog.pg_try_advisory_lock_shared($1::bigint) AS ok`, one("ok", FnTry|FnShared, par(1))},
		{`SELECT pg_advisory_unlock(7) "Released"`, one("Released", FnUnlock, lit(7))},
		{`SELECT pg_advisory_unlock(7) AS Released`, one("released", FnUnlock, lit(7))},
		{`SELECT "pg_advisory_lock"(5)`, one("pg_advisory_lock", 0, lit(5))},
		{`SELECT "pg_catalog"."pg_advisory_lock"(5)`, one("pg_advisory_lock", 0, lit(5))},
		{`SELECT pg_advisory_lock(1, -2)`, one("pg_advisory_lock", 0, lit(1), lit(-2))},
		{`SELECT pg_advisory_xact_lock(hashtext('x'))`, one("pg_advisory_xact_lock", FnXact, expr("hashtext('x')"))},
		{`SELECT pg_advisory_unlock_all()`, one("pg_advisory_unlock_all", FnUnlockAll)},
		{`SELECT pg_advisory_lock(f(1, 2))`, one("pg_advisory_lock", 0, expr("f(1, 2)"))},
		{`SELECT pg_advisory_lock(id) FROM t`, Advisory{Statements: 1, Calls: []AdvisoryCall{{Args: [2]Arg{expr("id")}, NArgs: 1}}}},
		{`SELECT pg_advisory_lock(1), pg_advisory_lock(2) AS b`, Advisory{Statements: 1, TargetList: true, Calls: []AdvisoryCall{
			{Args: [2]Arg{lit(1)}, NArgs: 1, Column: "pg_advisory_lock"}, {Args: [2]Arg{lit(2)}, NArgs: 1, Column: "b"}}}},
		{`SELECT CASE WHEN pg_try_advisory_lock(7) THEN 1 END`, Advisory{Statements: 1, Calls: []AdvisoryCall{{Func: FnTry, Args: [2]Arg{lit(7)}, NArgs: 1}}}},
		{`SELECT 'pg_advisory_lock(1)' /* pg_advisory_lock(2) */`, Advisory{Statements: 1, Uncertain: true}},
		{`SELECT 1 /* takes no advisory lock */`, Advisory{Statements: 1}},
		{`SELECT "PG_ADVISORY_LOCK"(5)`, Advisory{Statements: 1, Uncertain: true}},
		{`SELECT my_advisory_lock(5)`, Advisory{Statements: 1, Uncertain: true}},
		{`DO $$BEGIN PERFORM pg_advisory_lock(5); END$$`, Advisory{Statements: 1, Uncertain: true}},
		{`SELECT pg_advisory_lock($1::bigint * 1000 + $2)`, one("pg_advisory_lock", 0, expr("$1::bigint * 1000 + $2"))},
		{`SELECT pg_advisory_lock(42::int8 + $1)`, one("pg_advisory_lock", 0, expr("42::int8 + $1"))},
		{`SELECT pg_advisory_lock($1::int8)`, one("pg_advisory_lock", 0, par(1))},
		{`SELECT pg_advisory_lock(CASE WHEN pg_try_advisory_lock(2) THEN 1 END)`, Advisory{Statements: 1, TargetList: true, Simple: true, Uncertain: true,
			Calls: []AdvisoryCall{{Args: [2]Arg{expr("CASE WHEN pg_try_advisory_lock(2) THEN 1 END")}, NArgs: 1, Column: "pg_advisory_lock"}}}},
		{`discard ALL`, Advisory{Statements: 1, DiscardAll: true}},
		{`/* reset */ DISCARD ALL;`, Advisory{Statements: 1, DiscardAll: true}},
		{`BEGIN; SELECT pg_advisory_xact_lock(11); CREATE TABLE t (id int); COMMIT;`, Advisory{Statements: 4,
			Calls: []AdvisoryCall{{Func: FnXact, Args: [2]Arg{lit(11)}, NArgs: 1}}}},
	}
	for _, c := range cases {
		if got := ParseAdvisory(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.in, got, c.want)
		}
		if !MayAdvisory(c.in) && (len(c.want.Calls) > 0 || c.want.DiscardAll || c.want.Uncertain) {
			t.Errorf("MayAdvisory(%s) = false", c.in)
		}
	}
	for _, s := range []string{"SELECT 1", "UPDATE t SET v = 1", "SELECT v FROM advise", "-- discard\nSELECT 1"} {
		if MayAdvisory(s) {
			t.Errorf("MayAdvisory(%s) = true", s)
		}
	}
}

func TestTxControl(t *testing.T) {
	for in, want := range map[string]TxEffect{
		"SELECT 1":                           TxNone,
		"BEGIN":                              TxBegin,
		"begin isolation level serializable": TxBegin,
		"START TRANSACTION":                  TxBegin,
		"COMMIT":                             TxEnd,
		"end;":                               TxEnd,
		"ROLLBACK TO SAVEPOINT a":            TxNone,
		"ROLLBACK AND CHAIN":                 TxChain,
		"COMMIT AND NO CHAIN":                TxEnd,
		"PREPARE TRANSACTION 'x'":            TxEnd,
		"COMMIT PREPARED 'x'":                TxNone,
		"BEGIN; SELECT 1; COMMIT;":           TxEnd,
		"COMMIT; BEGIN":                      TxBegin,
		"DO $$BEGIN NULL; END$$":             TxNone,
		"/* c */ Begin; select 'COMMIT'":     TxBegin,
	} {
		if got := TxControl(in); got != want {
			t.Errorf("TxControl(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestIsWrite(t *testing.T) {
	for in, want := range map[string]bool{
		"INSERT INTO t VALUES (1)":                           true,
		"  /* c */ update t SET v = 1":                       true,
		"DELETE FROM t":                                      true,
		"REPLACE INTO t VALUES (1)":                          true,
		"CREATE TABLE t (id int)":                            true,
		"WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x": true,
		"WITH x AS (SELECT 1) SELECT * FROM x":               false,
		"SELECT 1":                                           false,
		"PRAGMA journal_mode":                                false,
		"":                                                   false,
		"insertion":                                          false,
		// Issue 11: the structure decides, not a keyword anywhere.
		"WITH t AS (SELECT replace(name,' ','-') AS n FROM u) SELECT * FROM t":              false,
		"with t as (select 1), u(x) as materialized (select replace('a','a','b')) select 1": false,
		"WITH RECURSIVE c(n) AS (VALUES(1) UNION ALL SELECT n+1 FROM c) SELECT n FROM c":    false,
		"WITH t AS ((SELECT 1)) SELECT delete_flag, \"update\" FROM t":                      false,
		"WITH t AS (SELECT 'INSERT') SELECT * FROM t -- DELETE":                             false,
		"WITH t AS (WITH u AS (SELECT 1) SELECT * FROM u) SELECT * FROM t":                  false,
		"SELECT replace(name, 'a', 'b') FROM t":                                             false,
		"EXPLAIN QUERY PLAN INSERT INTO t VALUES (1)":                                       false,
		"WITH t AS (SELECT 1) REPLACE INTO u SELECT * FROM t":                               true,
		"WITH t AS NOT MATERIALIZED (SELECT 1) UPDATE u SET x = 1":                          true,
		"WITH \"t\"(a, b) AS (SELECT 1, 2), u AS (SELECT 3) DELETE FROM v":                  true,
		"WITH t AS (DELETE FROM u RETURNING *) SELECT * FROM t":                             true,
		"WITH t AS (WITH u AS (SELECT 1) INSERT INTO v SELECT * FROM u) SELECT 1":           true,
		"SELECT 1; INSERT INTO t VALUES (1)":                                                true,
		"SELECT ';'; SELECT (1);":                                                           false,
		"WITH":                                                                              true,
		"WITH t AS (SELECT 1":                                                               true,
	} {
		if got := IsWrite(in); got != want {
			t.Errorf("IsWrite(%q) = %v", in, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		IsWrite("INSERT INTO t VALUES (?)")
		IsWrite("WITH t AS (SELECT replace(name,' ','-') FROM u), v AS (SELECT 1) SELECT * FROM t; SELECT 2")
	}); n != 0 {
		t.Errorf("IsWrite allocated %v times", n)
	}
}

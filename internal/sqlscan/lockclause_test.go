package sqlscan

import (
	"testing"
)

// noKeyCases: input -> expected output of Rewrite(…, Postgres, NoKeyUpdate).
// An empty want means "unchanged". integration/sqloracle reads this literal
// as Go source and checks its inputs against PostgreSQL's parser too; keep
// it a literal with the input as each case's second field.
var noKeyCases = []struct{ name, in, want string }{
	{"plain", `SELECT * FROM t WHERE id = 1 FOR UPDATE`, `SELECT * FROM t WHERE id = 1 FOR NO KEY UPDATE`},
	{"lower case", `select * from t for update`, `select * from t for NO KEY update`},
	{"OF list", `SELECT * FROM a JOIN b ON a.id = b.a FOR UPDATE OF a, b`, `SELECT * FROM a JOIN b ON a.id = b.a FOR NO KEY UPDATE OF a, b`},
	{"NOWAIT", `SELECT 1 FROM t FOR UPDATE NOWAIT`, `SELECT 1 FROM t FOR NO KEY UPDATE NOWAIT`},
	{"SKIP LOCKED", `SELECT id FROM jobs ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED`, `SELECT id FROM jobs ORDER BY id LIMIT 10 FOR NO KEY UPDATE SKIP LOCKED`},
	{"comment and newline between", "SELECT 1 FROM t FOR /* why */\n  UPDATE", "SELECT 1 FROM t FOR /* why */\n  NO KEY UPDATE"},
	{"line comment between", "SELECT 1 FROM t FOR -- x\nUPDATE", "SELECT 1 FROM t FOR -- x\nNO KEY UPDATE"},
	{"several clauses", `SELECT * FROM a, b FOR UPDATE OF a FOR SHARE OF b FOR UPDATE OF "B"`, `SELECT * FROM a, b FOR NO KEY UPDATE OF a FOR SHARE OF b FOR NO KEY UPDATE OF "B"`},
	{"subquery", `SELECT * FROM (SELECT * FROM t FOR UPDATE) s`, `SELECT * FROM (SELECT * FROM t FOR NO KEY UPDATE) s`},
	{"IN subquery", `UPDATE t SET v = 1 WHERE id IN (SELECT id FROM t WHERE v = 0 LIMIT 5 FOR UPDATE SKIP LOCKED)`, `UPDATE t SET v = 1 WHERE id IN (SELECT id FROM t WHERE v = 0 LIMIT 5 FOR NO KEY UPDATE SKIP LOCKED)`},
	{"CTE", `WITH c AS (SELECT id FROM t FOR UPDATE) UPDATE t SET v = 1 FROM c WHERE t.id = c.id`, `WITH c AS (SELECT id FROM t FOR NO KEY UPDATE) UPDATE t SET v = 1 FROM c WHERE t.id = c.id`},
	{"CTE materialized", `WITH c AS MATERIALIZED (SELECT 1 FROM t FOR UPDATE) SELECT * FROM c`, `WITH c AS MATERIALIZED (SELECT 1 FROM t FOR NO KEY UPDATE) SELECT * FROM c`},
	{"UNION arms", `(SELECT 1 FROM a FOR UPDATE) UNION ALL (SELECT 1 FROM b FOR UPDATE)`, `(SELECT 1 FROM a FOR NO KEY UPDATE) UNION ALL (SELECT 1 FROM b FOR NO KEY UPDATE)`},
	{"double parens", `((SELECT 1 FROM a) FOR UPDATE)`, `((SELECT 1 FROM a) FOR NO KEY UPDATE)`},
	{"cursor", `DECLARE c CURSOR FOR SELECT * FROM t FOR UPDATE`, `DECLARE c CURSOR FOR SELECT * FROM t FOR NO KEY UPDATE`},
	{"multi-statement", `SELECT 1 FROM a FOR UPDATE; SELECT 2 FROM b FOR UPDATE`, `SELECT 1 FROM a FOR NO KEY UPDATE; SELECT 2 FROM b FOR NO KEY UPDATE`},
	{"EXISTS", `DELETE FROM c WHERE EXISTS (SELECT 1 FROM p WHERE p.id = c.p FOR UPDATE)`, `DELETE FROM c WHERE EXISTS (SELECT 1 FROM p WHERE p.id = c.p FOR NO KEY UPDATE)`},
	{"INSERT SELECT", `INSERT INTO log SELECT * FROM t FOR UPDATE`, `INSERT INTO log SELECT * FROM t FOR NO KEY UPDATE`},
	{"EXPLAIN", `EXPLAIN (ANALYZE, COSTS OFF) SELECT * FROM t FOR UPDATE`, `EXPLAIN (ANALYZE, COSTS OFF) SELECT * FROM t FOR NO KEY UPDATE`},
	{"PREPARE", `PREPARE p (int) AS SELECT * FROM t WHERE id = $1 FOR UPDATE`, `PREPARE p (int) AS SELECT * FROM t WHERE id = $1 FOR NO KEY UPDATE`},
	{"quoted table, qualified OF", `SELECT * FROM "my table" m FOR UPDATE OF m`, `SELECT * FROM "my table" m FOR NO KEY UPDATE OF m`},
	{"limit after clause", `SELECT * FROM t FOR UPDATE LIMIT 1`, `SELECT * FROM t FOR NO KEY UPDATE LIMIT 1`},
	{"GORM", `SELECT * FROM "users" WHERE "users"."id" = $1 AND "users"."deleted_at" IS NULL ORDER BY "users"."id" LIMIT $2 FOR UPDATE`,
		`SELECT * FROM "users" WHERE "users"."id" = $1 AND "users"."deleted_at" IS NULL ORDER BY "users"."id" LIMIT $2 FOR NO KEY UPDATE`},
	{"ent", `SELECT "users"."id", "users"."name" FROM "users" WHERE "users"."id" = $1 FOR UPDATE`, `SELECT "users"."id", "users"."name" FROM "users" WHERE "users"."id" = $1 FOR NO KEY UPDATE`},
	{"leading comment", `/* app */ SELECT 1 FROM t FOR UPDATE`, `/* app */ SELECT 1 FROM t FOR NO KEY UPDATE`},
	{"UPDATE at end without space", "SELECT 1 FROM t FOR UPDATE;", "SELECT 1 FROM t FOR NO KEY UPDATE;"},

	// No change.
	{"no key already", `SELECT 1 FROM t FOR NO KEY UPDATE`, ``},
	{"share", `SELECT 1 FROM t FOR SHARE`, ``},
	{"key share", `SELECT 1 FROM t FOR KEY SHARE SKIP LOCKED`, ``},
	{"string", `SELECT 'FOR UPDATE' FROM t`, ``},
	{"E string", `SELECT E'\' FOR UPDATE' FROM t`, ``},
	{"dollar string", `SELECT $$ FOR UPDATE $$`, ``},
	{"DO block", `DO $$ BEGIN PERFORM 1 FROM t FOR UPDATE; END $$`, ``},
	{"function body", `CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $fn$ BEGIN PERFORM * FROM t FOR UPDATE; END $fn$`, ``},
	{"quoted identifier", `SELECT "FOR UPDATE" FROM t`, ``},
	{"line comment", "SELECT 1 FROM t -- FOR UPDATE", ``},
	{"block comment", `SELECT 1 FROM t /* FOR UPDATE */`, ``},
	{"nested comment", `SELECT 1 FROM t /* /* */ FOR UPDATE */`, ``},
	{"create policy", `CREATE POLICY p ON t FOR UPDATE USING (owner = current_user)`, ``},
	{"alter policy", `ALTER POLICY p ON t FOR UPDATE TO r`, ``},
	{"create view", `CREATE VIEW v AS SELECT * FROM t FOR UPDATE`, ``},
	{"create table as", `CREATE TABLE x AS SELECT * FROM t FOR UPDATE`, ``},
	{"begin atomic body", `CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 FROM t FOR UPDATE; SELECT CASE WHEN true THEN 1 END FROM t FOR UPDATE; END`, ``},
	{"substring FOR", `SELECT substring(s FROM 1 FOR 2) FROM t`, ``},
	{"function args not a query", `SELECT overlay(s PLACING 'x' FROM 1 FOR 2) FROM t`, ``},
	{"cursor FOR SELECT alone", `DECLARE c CURSOR FOR SELECT 1`, ``},
	{"keep comment", `SELECT 1 FROM t FOR UPDATE /*lockhooks:keep-for-update*/`, ``},
	{"keep comment first", `/*lockhooks:keep-for-update*/ SELECT 1 FROM t FOR UPDATE`, ``},
	{"for ordinality", `SELECT * FROM unnest(a) WITH ORDINALITY AS u FOR UPDATE`, `SELECT * FROM unnest(a) WITH ORDINALITY AS u FOR NO KEY UPDATE`},
	{"identifier containing for", `SELECT before_update, foreign_key FROM t`, ``},
}

func TestRewriteNoKeyUpdate(t *testing.T) {
	for _, c := range noKeyCases {
		want := c.want
		if want == "" {
			want = c.in
		}
		got, _ := Rewrite(c.in, Postgres, NoKeyUpdate)
		if got != want {
			t.Errorf("%s:\n  in: %s\n got: %s\nwant: %s", c.name, c.in, got, want)
		}
		if again, _ := Rewrite(got, Postgres, NoKeyUpdate); again != got {
			t.Errorf("%s: not idempotent: %s", c.name, again)
		}
	}
}

// The keep comment protects only its own statement.
func TestKeepCommentIsPerStatement(t *testing.T) {
	in := `SELECT 1 FROM a FOR UPDATE /*lockhooks:keep-for-update*/; SELECT 1 FROM b FOR UPDATE`
	want := `SELECT 1 FROM a FOR UPDATE /*lockhooks:keep-for-update*/; SELECT 1 FROM b FOR NO KEY UPDATE`
	got, info := Rewrite(in, Postgres, NoKeyUpdate)
	if got != want {
		t.Errorf("got %s", got)
	}
	if info&Kept == 0 {
		t.Error("info lacks Kept")
	}
}

func TestRewriteReportsLockInfo(t *testing.T) {
	for in, want := range map[string]LockInfo{
		`SELECT 1 FROM t FOR UPDATE`:                        ForUpdate,
		`SELECT 1 FROM t FOR NO KEY UPDATE NOWAIT`:          ForNoKeyUpdate | NoWait,
		`SELECT 1 FROM t FOR SHARE OF t SKIP LOCKED`:        ForShare | SkipLocked,
		`SELECT 1 FROM t FOR KEY SHARE`:                     ForKeyShare,
		`SELECT 1 FROM t`:                                   0,
		`CREATE POLICY p ON t FOR UPDATE USING (true)`:      0,
		`SELECT 1 FROM a FOR UPDATE OF a FOR SHARE OF b`:    ForUpdate | ForShare,
		`SELECT 1 FROM a FOR UPDATE OF "s"."a", b.c NOWAIT`: ForUpdate | NoWait,
	} {
		if _, got := Rewrite(in, Postgres, Inspect); got != want {
			t.Errorf("%s: info %b, want %b", in, got, want)
		}
	}
}

func TestStripForSQLite(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT * FROM t WHERE id = ? FOR UPDATE`, `SELECT * FROM t WHERE id = ? `},
		{`SELECT * FROM t FOR NO KEY UPDATE OF t SKIP LOCKED`, `SELECT * FROM t `},
		{`SELECT * FROM t FOR SHARE NOWAIT;`, `SELECT * FROM t ;`},
		{`SELECT * FROM t FOR KEY SHARE OF "t", u LIMIT 1`, `SELECT * FROM t  LIMIT 1`},
		{`SELECT * FROM a FOR UPDATE OF a FOR SHARE OF b`, `SELECT * FROM a  `},
		{`SELECT * FROM (SELECT * FROM t FOR UPDATE) s`, `SELECT * FROM (SELECT * FROM t ) s`},
		{`SELECT 'FOR UPDATE' FROM t`, `SELECT 'FOR UPDATE' FROM t`},
		{"SELECT [for update] FROM t", "SELECT [for update] FROM t"},
		{"CREATE TRIGGER tr AFTER UPDATE ON t FOR EACH ROW BEGIN SELECT 1 FROM t FOR UPDATE; END; SELECT 1 FROM t FOR UPDATE",
			"CREATE TRIGGER tr AFTER UPDATE ON t FOR EACH ROW BEGIN SELECT 1 FROM t FOR UPDATE; END; SELECT 1 FROM t "},
	} {
		got, info := Rewrite(c.in, SQLite, Strip)
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.in, got, c.want)
		}
		if got != c.in && !info.Locks() {
			t.Errorf("%s: stripped but info %b has no lock", c.in, info)
		}
	}
}

func TestMayLock(t *testing.T) {
	for in, want := range map[string]bool{
		"SELECT 1": false, "select 1 for update": true, "FOREIGN": true, "": false, "fo": false, "xFoR": true,
	} {
		if got := MayLock(in); got != want {
			t.Errorf("MayLock(%q) = %v", in, got)
		}
	}
}

func TestRewriteAllocatesNothingWhenUnchanged(t *testing.T) {
	q := `SELECT a, b, c FROM t WHERE id = $1 AND s = 'for update' /* FOR UPDATE */ ORDER BY a FOR SHARE`
	if n := testing.AllocsPerRun(100, func() { Rewrite(q, Postgres, NoKeyUpdate) }); n != 0 {
		t.Errorf("Rewrite of a text it does not change allocated %v times", n)
	}
}

func TestFirstTable(t *testing.T) {
	for in, want := range map[string]string{
		`SELECT * FROM runs LEFT JOIN jobs ON jobs.run_id = runs.id FOR UPDATE`: "runs",
		`SELECT * FROM runs r LEFT JOIN jobs j ON j.run_id = r.id FOR UPDATE`:   "r",
		`SELECT * FROM public.runs AS "R" LEFT JOIN jobs ON true`:               `"R"`,
		`SELECT * FROM ONLY s.runs WHERE id = 1`:                                "s.runs",
		`SELECT (SELECT 1 FROM inner_t), x FROM outer_t LEFT JOIN y ON true`:    "outer_t",
		`SELECT 1`: "",
		`SELECT "users".* FROM "users" LEFT JOIN "companies" "Company" ON true FOR UPDATE`: `"users"`,
	} {
		if got := FirstTable(in, Postgres); got != want {
			t.Errorf("FirstTable(%s) = %q, want %q", in, got, want)
		}
	}
}

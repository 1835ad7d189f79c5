package sqloracle

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// oracleCorpus holds real queries: ORM output (GORM, ent), the statements of
// the seeds (dstack's locking rules, the row-lock primer) and examples from
// PostgreSQL's documentation.
var oracleCorpus = []string{
	// GORM (clause.Locking) on Postgres.
	`SELECT * FROM "users" WHERE "users"."id" = $1 AND "users"."deleted_at" IS NULL ORDER BY "users"."id" LIMIT $2 FOR UPDATE`,
	`SELECT * FROM "orders" WHERE status = $1 AND "orders"."deleted_at" IS NULL FOR UPDATE SKIP LOCKED`,
	`SELECT * FROM "users" WHERE "users"."deleted_at" IS NULL FOR UPDATE OF "users" NOWAIT`,
	`SELECT * FROM "users" WHERE name = $1 FOR SHARE OF "users"`,
	`SELECT "users"."id","users"."name","Company"."id" AS "Company__id" FROM "users" LEFT JOIN "companies" "Company" ON "users"."company_id" = "Company"."id" WHERE "users"."id" = $1 FOR UPDATE OF "users"`,
	// ent (sql.Selector ForUpdate / ForShare).
	`SELECT "users"."id", "users"."age", "users"."name" FROM "users" WHERE "users"."id" = $1 LIMIT 2 FOR UPDATE`,
	`SELECT "pets"."id", "pets"."name" FROM "pets" JOIN "users" AS "t1" ON "pets"."owner_id" = "t1"."id" WHERE "t1"."id" = $1 FOR UPDATE OF "pets"`,
	`SELECT "users"."id" FROM "users" WHERE "users"."age" > $1 FOR SHARE NOWAIT`,
	`SELECT "tasks"."id" FROM "tasks" ORDER BY "tasks"."id" LIMIT 10 FOR UPDATE SKIP LOCKED`,
	// The seeds.
	`SELECT runs.id FROM runs WHERE runs.status NOT IN ('terminated', 'failed') ORDER BY runs.last_processed_at ASC LIMIT 1 FOR UPDATE OF runs SKIP LOCKED`,
	`SELECT jobs.id FROM jobs WHERE jobs.run_id = $1 ORDER BY jobs.id FOR UPDATE`,
	`SELECT runs.* FROM runs LEFT OUTER JOIN jobs ON jobs.run_id = runs.id WHERE runs.id = $1 FOR UPDATE OF runs`,
	`SELECT pg_advisory_xact_lock($1)`,
	`SELECT * FROM accounts WHERE id IN (1, 2) ORDER BY id FOR UPDATE`,
	`UPDATE accounts SET balance = balance - 100 WHERE id = 1 AND balance = 500`,
	`SELECT balance FROM accounts WHERE id = $1 FOR UPDATE; UPDATE accounts SET balance = balance - $2 WHERE id = $1`,
	// PostgreSQL documentation (SELECT, DECLARE, explicit locking).
	`SELECT * FROM mytable WHERE key = 1 FOR UPDATE`,
	`SELECT * FROM (SELECT * FROM mytable FOR UPDATE) ss WHERE col1 = 5`,
	`SELECT * FROM (SELECT * FROM mytable FOR UPDATE) ss ORDER BY column1`,
	`SELECT * FROM mytable WHERE key = 1 FOR NO KEY UPDATE`,
	`SELECT * FROM queue WHERE processed = false ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`,
	`DECLARE liahona CURSOR FOR SELECT * FROM films FOR UPDATE`,
	`SELECT * FROM films f JOIN distributors d USING (did) FOR UPDATE OF f NOWAIT FOR SHARE OF d`,
	`WITH t AS (SELECT * FROM accounts WHERE acctnum = 11111 FOR UPDATE) UPDATE accounts SET balance = balance + 100.00 FROM t WHERE accounts.acctnum = t.acctnum`,
	`WITH RECURSIVE t(n) AS (VALUES (1) UNION ALL SELECT n + 1 FROM t WHERE n < 100) SELECT sum(n) FROM t`,
	`SELECT * FROM a WHERE id = ANY (ARRAY(SELECT id FROM b FOR UPDATE))`,
	`INSERT INTO archive SELECT * FROM events WHERE ts < now() - interval '1 day' FOR UPDATE`,
	`DELETE FROM jobs WHERE id = (SELECT id FROM jobs ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING *`,
	`EXPLAIN (COSTS OFF) SELECT * FROM t FOR UPDATE`,
	`SELECT substring('hello' FROM 1 FOR 2), overlay('abc' PLACING 'x' FROM 1 FOR 1) FROM t FOR UPDATE`,
	`SELECT E'\\' FOR UPDATE', $$ FOR UPDATE $$, "for update" FROM t /* FOR UPDATE */ FOR UPDATE -- FOR UPDATE`,
	`DO $$ BEGIN PERFORM 1 FROM t FOR UPDATE; END $$`,
	`CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $fn$ BEGIN PERFORM * FROM t FOR UPDATE; END $fn$`,
	`CREATE FUNCTION g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1 FROM t FOR UPDATE; SELECT CASE WHEN true THEN 1 END FROM t FOR UPDATE; END`,
	`CREATE POLICY p ON t FOR UPDATE USING (owner = current_user)`,
	`CREATE VIEW v AS SELECT * FROM t FOR UPDATE`,
}

// dmlStatements are the parse-tree statement kinds the rewrite applies to.
var dmlStatements = map[string]bool{
	"SelectStmt": true, "InsertStmt": true, "UpdateStmt": true, "DeleteStmt": true, "MergeStmt": true,
	"DeclareCursorStmt": true, "ExplainStmt": true, "PrepareStmt": true, "CopyStmt": true,
}

// The parse tree of the rewritten text must equal the original's with
// LCS_FORUPDATE replaced by LCS_FORNOKEYUPDATE in DML statements, and be
// unchanged in every other statement.
func TestRewriteAgainstPostgresParser(t *testing.T) {
	corpus := append(append([]string(nil), oracleCorpus...), noKeyCasesForOracle(t)...)
	parsed := 0
	for _, q := range corpus {
		before, err := parseStmts(q)
		if err != nil {
			continue // table-test inputs need not be valid SQL
		}
		parsed++
		out, _ := sqlscan.Rewrite(q, sqlscan.Postgres, sqlscan.NoKeyUpdate)
		after, err := parseStmts(out)
		if err != nil {
			t.Errorf("the rewrite broke a valid statement:\n  in: %s\n out: %s\n err: %v", q, out, err)
			continue
		}
		keep := strings.Contains(q, sqlscan.KeepComment)
		for i := range before {
			want := before[i]
			if !keep && isDML(want) {
				want = replaceStrength(want)
			}
			if !reflect.DeepEqual(after[i], want) {
				a, _ := json.Marshal(after[i])
				w, _ := json.Marshal(want)
				t.Errorf("parse trees differ for statement %d of\n  in: %s\n out: %s\n got:  %s\n want: %s", i, q, out, a, w)
			}
		}
	}
	if parsed < len(oracleCorpus) {
		t.Errorf("only %d of the corpus parsed", parsed)
	}
	t.Logf("%d statements checked against the Postgres parser", parsed)
}

// tableTestFile holds sqlscan's table test; its inputs join the corpus.
const tableTestFile = "../../internal/sqlscan/lockclause_test.go"

// noKeyCasesForOracle returns the inputs (second field) of the noKeyCases
// table in sqlscan's table test. A test file of another module cannot be
// imported, so it is read as Go source; if the table moves or changes shape
// the oracle fails rather than silently checking less.
func noKeyCasesForOracle(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), tableTestFile, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var inputs []string
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "noKeyCases" || len(vs.Values) != 1 {
			return true
		}
		lit, ok := vs.Values[0].(*ast.CompositeLit)
		if !ok {
			t.Fatalf("%s: noKeyCases is not a composite literal", tableTestFile)
		}
		found = true
		for _, elt := range lit.Elts {
			c, ok := elt.(*ast.CompositeLit)
			if !ok || len(c.Elts) < 2 {
				t.Fatalf("%s: unexpected noKeyCases element %T", tableTestFile, elt)
			}
			bl, ok := c.Elts[1].(*ast.BasicLit)
			if !ok || bl.Kind != token.STRING {
				t.Fatalf("%s: noKeyCases input is not a string literal", tableTestFile)
			}
			in, err := strconv.Unquote(bl.Value)
			if err != nil {
				t.Fatal(err)
			}
			inputs = append(inputs, in)
		}
		return false
	})
	if !found || len(inputs) == 0 {
		t.Fatalf("%s: no noKeyCases table found", tableTestFile)
	}
	return inputs
}

// parseStmts returns each statement's parse tree without source positions.
func parseStmts(q string) ([]any, error) {
	j, err := pg_query.ParseToJSON(q)
	if err != nil {
		return nil, err
	}
	var tree struct {
		Stmts []struct {
			Stmt any `json:"stmt"`
		} `json:"stmts"`
	}
	if err := json.Unmarshal([]byte(j), &tree); err != nil {
		return nil, err
	}
	out := make([]any, len(tree.Stmts))
	for i, s := range tree.Stmts {
		out[i] = dropLocations(s.Stmt)
	}
	return out, nil
}

// dropLocations removes byte offsets, which the inserted text shifts.
func dropLocations(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if k == "location" || k == "stmt_location" || k == "stmt_len" {
				delete(v, k)
				continue
			}
			v[k] = dropLocations(x)
		}
	case []any:
		for i, x := range v {
			v[i] = dropLocations(x)
		}
	}
	return v
}

func isDML(stmt any) bool {
	m, ok := stmt.(map[string]any)
	if !ok {
		return false
	}
	for k := range m {
		return dmlStatements[k]
	}
	return false
}

// replaceStrength returns a copy of v with LCS_FORUPDATE made
// LCS_FORNOKEYUPDATE.
func replaceStrength(v any) any {
	switch v := v.(type) {
	case map[string]any:
		c := make(map[string]any, len(v))
		for k, x := range v {
			c[k] = replaceStrength(x)
		}
		return c
	case []any:
		c := make([]any, len(v))
		for i, x := range v {
			c[i] = replaceStrength(x)
		}
		return c
	case string:
		if v == "LCS_FORUPDATE" {
			return "LCS_FORNOKEYUPDATE"
		}
	}
	return v
}

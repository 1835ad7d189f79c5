package sqlscan

import (
	"strings"
	"testing"
)

// stmt200 is a 200-byte statement with strings, a comment and no locking
// clause, as an ORM would send it.
var stmt200 = `SELECT "users"."id", "users"."name", "users"."format" FROM "users" /* app */ WHERE "users"."name" = 'o''brien' AND "users"."deleted_at" IS NULL AND "users"."org_id" = $1 ORDER BY "users"."id" LIMIT 50`

func BenchmarkScan200(b *testing.B) {
	if len(stmt200) != 200 {
		b.Fatalf("statement is %d bytes", len(stmt200))
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(stmt200)))
	for b.Loop() {
		Rewrite(stmt200, Postgres, NoKeyUpdate)
	}
}

// BenchmarkClassify200 is a first sight of the 200-byte statement: every
// fact a connection needs (text to send, locking clauses, advisory calls,
// write or read, first table) in one pass.
func BenchmarkClassify200(b *testing.B) {
	for _, c := range []struct {
		name string
		d    Dialect
		op   Op
	}{{"postgres", Postgres, NoKeyUpdate}, {"sqlite", SQLite, Strip}} {
		b.Run("dialect="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(stmt200)))
			for b.Loop() {
				Classify(stmt200, c.d, c.op)
			}
		})
	}
}

func BenchmarkRewrite200(b *testing.B) {
	q := strings.Replace(stmt200, "LIMIT 50", "FOR UPDATE", 1)
	b.ReportAllocs()
	b.SetBytes(int64(len(q)))
	for b.Loop() {
		Rewrite(q, Postgres, NoKeyUpdate)
	}
}

func BenchmarkMayLock200(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(stmt200)))
	for b.Loop() {
		MayLock(stmt200)
	}
}

// IsWrite runs on every autocommit SQLite statement: a SELECT is decided
// by its first word and a search for ';', a WITH by its CTE structure.
func BenchmarkIsWrite200(b *testing.B) {
	with := "WITH t AS (SELECT replace(name, ' ', '-') AS n FROM users WHERE org_id = ?) " + stmt200[:120]
	b.ReportAllocs()
	for b.Loop() {
		IsWrite(stmt200)
		IsWrite(with)
	}
}

// Package sqloracle holds the test that checks lockhooks' SQL rewrite
// (internal/sqlscan) against PostgreSQL's own parser, through pg_query_go
// (cgo: libpg_query). It has no code of its own; it lives in the integration
// module so that the library's go.mod does not require pg_query_go.
package sqloracle

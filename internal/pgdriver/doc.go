// Package pgdriver is what lockhooks knows of the Postgres drivers behind
// database/sql, pgx's stdlib and lib/pq, without importing them (the
// library imports no driver): found by reflection on the driver's own
// connection, each piece checked for the shape it relies on, so that
// another driver, or another version, gets nothing rather than a wrong
// answer.
//
// Its one job: what the driver allows lockhooks' own statements
// ([Statements]: whether a text of several statements runs in one
// simple-protocol round trip, uncached, and the query argument that makes
// pgx run it so, which is pgx's QueryExecModeSimpleProtocol), the
// transaction status of the server's last ReadyForQuery ([TxStatus]), the
// connection's configured default mode ([DefaultMode]), and the process id
// of the BackendKeyData the server or a pooler sent at connect
// ([BackendKeyPID]); and the values drivers return for lockhooks' own
// reads, converted whatever their Go type ([AsString], [AsInt64],
// [AsFloat64], [AsBool]); and where a DSN or a connector points, host,
// port and database, never the user or password ([Target],
// [ConnectorTarget], [KeyValues], fuzzed), for a database's default name.
//
// State: a database's [Statements], worked out from its first connection
// and then read; nothing else.
//
// Imports: nothing of ours; database/sql/driver for its argument values
// and the connectors it reads.
package pgdriver

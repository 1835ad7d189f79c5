// Package rawconn runs lockhooks' own statements on a raw driver
// connection, beside database/sql: on the inner connection of a wrapped
// one, on a side connection of a database, on a pooler's holder.
//
// Its one job: a query in the context form where the driver has it, else
// prepared and closed with its rows ([Query], [StmtQuery]); a statement
// run for its effect ([Exec]), or a text of several statements in the
// simple protocol ([ExecSimple]); the first row of an answer, read,
// copied out of the driver's buffers and kept as driver.Rows of its own
// ([ReadRow], [Row]), or made up by lockhooks ([OneValue]); and the
// legacy driver.Execer and driver.Queryer given their context forms
// ([LegacyExecer], [LegacyQueryer], [Unnamed], [Named]); and a database's
// one connection outside its pool for lookups, opened when first needed
// and used by one caller at a time ([Side]). What a statement
// means is the caller's: nothing here knows SQL or a driver by name.
//
// State: a database's side connection ([Side]: the connection, whose turn
// its users wait for); nothing else.
//
// Imports: nothing of lockhooks' own; database/sql/driver only.
package rawconn

package lockhooks

// The connection as its session-lock tracking's host (pgsession.Host):
// pgsession.Conn runs the session-lock machine (reading pg_locks, a
// statement's effect, a loss, a rerouted unlock, poolers) and asks the
// connection for what needs its driver, its hooks or its database. The
// three methods that ask the database's registry are here; the others
// live beside what they use: String (conn.go), Unwrap, Observe
// (conn.go), ExecOwn, BackendPID, QueryValue, QueryRow (conn_own.go), InTx
// (pg_pinning.go), PoolerDetected (pg_pooler.go), ConnectionBroken,
// LoseLocks, ReportLoss, LockLost, Ends, ThroughPooler (pg_loss.go),
// ReleaseTurn (pg_turns.go), HoldEnded, TxBegun (pg_pinning_apply.go),
// UnlockRerouted (pg_reroute.go), LoseIfReleased (advisory_released.go).

// SessionMarker is the session marker c left on its backend ("" when it
// left none: a declared pooler, or a server that refused it).
func (c *conn) SessionMarker() string { return c.mark }

// SawPooler records, in c's database, the proof (err) of a
// transaction-mode pooler nobody declared.
func (c *conn) SawPooler(err error) { c.connector.pins.SawPooler(err) }

// Settle tells c's database's registry what c holds now.
func (c *conn) Settle() { c.connector.pins.Settle(c) }

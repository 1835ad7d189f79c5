package lockhooks

// The connection as its session-lock tracking's host
// (pgsession.Host): reading pg_locks and making the tracking equal to it
// is pgsession.Conn's (Reconcile, ReadLocks, VerifyUnknown,
// VerifyOnReturn, FollowPin); what needs the connection's driver, hooks
// or database is here, or in the methods named (ExecOwn, BackendPID,
// InTx, Observe, PoolerDetected, ConnectionBroken, LoseLocks,
// ReleaseTurn, HoldEnded).

// SessionMarker is the session marker c left on its backend ("" when it
// left none: a declared pooler, or a server that refused it).
func (c *conn) SessionMarker() string { return c.mark }

// SawPooler records, in c's database, the proof (err) of a
// transaction-mode pooler nobody declared.
func (c *conn) SawPooler(err error) { c.connector.pins.SawPooler(err) }

// Settle tells c's database's registry what c holds now.
func (c *conn) Settle() { c.connector.pins.Settle(c) }

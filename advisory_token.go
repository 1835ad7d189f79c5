package lockhooks

// Token returns the lock's fencing token: a number that grows with every
// acquisition of the lock's key, so that the data a holder protects can
// refuse a holder whose lock was lost and taken by another meanwhile (a
// paused process, a partitioned replica), which no lock alone can stop.
// Store the token with the data and make every protected write conditional
// on it, in the statement itself:
//
//	UPDATE jobs SET state = $1, fence = $2 WHERE id = $3 AND fence < $2
//
// A write that updates no row came from a holder that was overtaken: stop.
//
// On Postgres the token is a 64-bit transaction id (pg_current_xact_id())
// taken while the lock is held, right after it was granted: on a
// connection to the server itself by AcquireAdvisoryLock's lock statement
// itself (one round trip); through a pooler by a read of its own, and
// through a transaction pooler on another server connection, so that the
// holder's open transaction never gets one. TryAdvisoryLock reads it once
// the lock is granted (a try that fails takes none). Transaction ids are
// assigned in increasing order across the whole cluster and never wrap
// (the epoch-extended xid8 of Postgres 13), so an acquisition's token is
// larger than the token of any acquisition of the same key that released
// it before, in any process. The cost: one transaction id per acquisition,
// and through a pooler one round trip.
//
// The token's transaction changes nothing, so Postgres commits it without
// flushing WAL or waiting for synchronous replication: should the primary
// crash (or fail over) before any later WAL is flushed, transaction ids it
// handed out since can be handed out again. A token is larger than every
// earlier acquisition's across one server's life, not across a crash:
// after one, stop the holders that outlived it.
//
// On SQLite, where the lock is in-process, the token grows with each
// acquisition in the process and starts from the clock (nanoseconds since
// 1970), so that it also grows across restarts unless the clock goes back.
//
// Token is 0 when no token could be assigned: on a hot standby (advisory
// locks work there, but no transaction id can be assigned during
// recovery), on Postgres before 13 (no pg_current_xact_id()), or when the
// read failed (the acquisition does not fail for it: the lock is held). A
// write fenced as above refuses 0, so code that relies on the token stops
// there instead of writing unfenced.
func (l *AdvisoryLock) Token() int64 { return l.lock.Token }

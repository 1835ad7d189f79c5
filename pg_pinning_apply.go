package lockhooks

// What an advisory-lock statement's answer does to a connection's tracking
// is pgsession.Conn.After's (the keys it granted or released applied to the
// held set, transaction-level locks and transaction control followed, and
// the breaks that end a statement's certainty); here are the connection's
// parts of it.

import (
	"context"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// HoldEnded records, for the hold-time metric, a session lock held
// since then that c holds no more.
func (c *conn) HoldEnded(since time.Time) {
	c.connector.tel.RecordHold(context.Background(), "advisory", "session", since)
}

// TxBegun reports whether database/sql runs a transaction on c (BeginTx).
func (c *conn) TxBegun() bool { return c.tx.inner != nil }

// holds reports whether c holds the session lock k.
func (c *conn) holds(k lockKey) bool { return c.pin.Holds(k) }

// addXact records transaction-level keys the transaction took through
// lockhooks' own statements (Lock on Postgres).
func (c *conn) addXact(keys []int64, site *callsite.Stack) {
	c.pin.Lock()
	defer c.pin.Unlock()
	c.pin.AddXactKeysLocked(keys, site)
	c.pin.UpdateLocked()
}

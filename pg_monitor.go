package lockhooks

import (
	"context"
)

// The parked connection as its database's monitor asks it
// (pgsession.Member): whether it still answers, and what pg_locks says it
// holds.

// Answers reports whether the parked connection c still answers a
// statement of lockhooks' own (a read, on whatever backend a pooler gives
// it); one whose connection broke (a reset, or silence past the check
// timeout) is lost with that cause. It changes nothing of c's tracking
// otherwise.
func (c *conn) Answers(ctx context.Context) bool { return c.pin.Answers(ctx) }

// VerifyParked reads pg_locks on the parked connection c: a connection
// that fails is lost, one that works makes the tracking true.
func (c *conn) VerifyParked(ctx context.Context) { c.pin.VerifyParked(ctx) }

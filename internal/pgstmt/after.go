package pgstmt

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// After runs after a statement of c planned by [Database.Before] (for
// queries: after its rows were closed), which failed with err or not:
// it brings the session-lock tracking up to date (pgsession.Conn.After),
// settles the key's turn the statement took, ends its self-wait probe and
// its lock wait, and returns the statement's error, explained (the holder
// of a wait that gave up named, a self-wait's cause), or the loss it met.
// results holds the first row of a target list, when the statement was a
// query whose row lockhooks saw; nil otherwise.
func (db *Database[C, K]) After(ctx context.Context, c C, plan Plan[C, K], results []driver.Value, err error) error {
	pin := c.Pin()
	if err == nil || dberr.FromServer(err) {
		pin.Trips.Answered()
		pin.Trips.Sent("") // lockhooks' own reads of pg_locks may follow
	}
	err = pin.After(ctx, &plan.Plan, results, err)
	if plan.Turn {
		settleTurn(c)
	}
	if err == nil || dberr.FromServer(err) {
		pin.Trips.Answered()
	}
	err = db.selfWaitResult(plan.Wait, plan.St.Text, err)
	if !(plan.St.Locks&sqlscan.NoWait != 0 && dberr.SQLState(err) == dberr.LockNotAvailable) { // NOWAIT did not wait
		err = db.NameHolder(c, plan.Wait, err)
	}
	err = plan.Wait.WithSelfHint(err)
	if err != nil {
		for _, h := range db.Others(err) { // the wait span links to the other side of the cycle
			plan.Wait.HeldBy(h)
		}
	}
	db.endLockWait(ctx, c, &plan, err)
	return err
}

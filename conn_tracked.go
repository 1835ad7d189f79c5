package lockhooks

// Statements whose effect lockhooks tracks: advisory-lock calls, row locks and
// writes that take the SQLite writer lock, run under their plan (the text
// sent, the wait traced, the keys the result grants or releases) and
// accounted for once the driver answered.

import (
	"context"
	"database/sql/driver"
	"slices"
)

// needsWriterLock notes that a statement ran in the current transaction,
// and reports whether the statement is an SQLite write outside a
// transaction (or a SELECT that asked for row locks), which must hold the
// writer lock while it runs.
func (c *conn) needsWriterLock(st statement) bool {
	if c.tx.inner != nil {
		c.tx.read = true
		if c.tx.writer {
			c.connector.writer.noteStatementInTx(c)
		}
		return false
	}
	return c.connector.opts.dialect == SQLite && (st.locks.Locks() || st.writes())
}

// queryWriting runs an SQLite query that writes under the writer lock,
// held until its rows are closed.
func (c *conn) queryWriting(ctx context.Context, st statement, query string, run func() (driver.Rows, error)) (driver.Rows, error) {
	if err := c.connector.writer.lock(ctx, c.connector.tel, c, c.connector.opts.busyTimeout, query); err != nil {
		return nil, err
	}
	rows, err := run()
	if err != nil {
		c.connector.writer.unlock()
		return nil, st.explain(c.Observe(err))
	}
	return newRows(ctx, c, rows, advisoryPlan{}, true), nil
}

// execTracked runs a statement that calls advisory-lock functions, or runs
// on a connection holding session locks, with the lock tracking around it.
// run runs the statement with a text and arguments, which are st's unless
// lockhooks changed them (pgstmt.Plan.Sent), where retext allows it (a
// statement that is not prepared).
func (c *conn) execTracked(ctx context.Context, st statement, args []driver.NamedValue, retext bool, run func(text string, args []driver.NamedValue) (driver.Result, error)) (driver.Result, error) {
	plan, answer, err := c.connector.stmts.Before(ctx, c, st.planned(), args, retext)
	if answer != nil && err == nil {
		return driver.RowsAffected(1), nil // a rerouted unlock: SELECT returned one row
	}
	if err != nil {
		return nil, err
	}
	if plan.OnHolder {
		answer, err := c.pin.RunOnHolder(ctx, plan.St.Advisory, plan.Keys[0], plan.Known[0], st.text, args)
		if err = c.afterTracked(ctx, plan, answer.Values(), err); err != nil {
			return nil, err
		}
		return driver.RowsAffected(1), nil
	}
	res, err := run(c.sentWith(plan, args))
	err = c.afterTracked(ctx, plan, nil, st.explain(c.Observe(err)))
	if err != nil {
		return nil, err
	}
	return res, nil
}

// queryTracked is execTracked for queries: the tracking is brought up to
// date when the rows are closed.
func (c *conn) queryTracked(ctx context.Context, st statement, args []driver.NamedValue, retext bool, run func(text string, args []driver.NamedValue) (driver.Rows, error)) (driver.Rows, error) {
	plan, answer, err := c.connector.stmts.Before(ctx, c, st.planned(), args, retext)
	if answer != nil && err == nil {
		return answer, nil
	}
	if err != nil {
		return nil, err
	}
	if plan.OnHolder {
		answer, err := c.pin.RunOnHolder(ctx, plan.St.Advisory, plan.Keys[0], plan.Known[0], st.text, args)
		if err = c.afterTracked(ctx, plan, answer.Values(), err); err != nil {
			return nil, err
		}
		return answer, nil
	}
	rows, err := run(c.sentWith(plan, args))
	if err != nil {
		return nil, c.afterTracked(ctx, plan, nil, st.explain(c.Observe(err)))
	}
	if st.advisory == nil {
		// A row-lock query: the driver has run it (pgx reads the first row
		// in QueryContext), so the wait is over.
		if err := c.afterTracked(ctx, plan, nil, nil); err != nil {
			rows.Close()
			return nil, err
		}
		return rows, nil
	}
	return newRows(ctx, c, rows, plan, false), nil
}

// sentWith returns the text and arguments a tracked statement runs with:
// its own, or, where lockhooks annotated it (pgstmt.Plan.Sent), that text,
// noted as the statement the backend runs. An annotated text this
// connection sent among its last few goes as the user's statements go (in
// pgx's default mode, prepared once and cached): a holder that takes one
// key at one call site, with no trace recorded, sends the same text every
// time. Any other goes behind pgx's QueryExecModeExec, which caches
// nothing, so that texts that change with every hold never fill the
// driver's statement cache.
func (c *conn) sentWith(plan advisoryPlan, args []driver.NamedValue) (string, []driver.NamedValue) {
	if plan.Sent == "" {
		return plan.St.Text, args
	}
	c.pin.Trips.Sent(plan.Sent)
	if slices.Contains(c.sentTexts[:], plan.Sent) && c.pin.Discards.Load() == 0 { // (DISCARD ALL forgot the driver's prepared statements)
		return plan.Sent, args
	}
	c.sentTexts[c.sentNext] = plan.Sent
	c.sentNext = (c.sentNext + 1) % len(c.sentTexts)
	// The driver reads the arguments during the call only, and a
	// connection runs one statement at a time: one slice serves them all.
	c.sentArgs = append(append(c.sentArgs[:0], c.connector.own.Exec...), args...)
	return plan.Sent, c.sentArgs
}

// afterTracked brings the lock tracking up to date and ends the lock wait
// (pgstmt.Database.After).
func (c *conn) afterTracked(ctx context.Context, plan advisoryPlan, results []driver.Value, err error) error {
	return c.connector.stmts.After(ctx, c, plan, results, err)
}

package lockhooks

import (
	"context"
	"database/sql/driver"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/pgbegin"
	"github.com/lockhooks/lockhooks/internal/retry"
)

// lockhooks' own BEGIN and COMMIT on Postgres (internal/pgbegin says
// when and how): the connection's part, which begins the transaction and
// records it, and the transaction that ends with lockhooks' own COMMIT and
// ROLLBACK.

// beginOwn begins a Postgres transaction with lockhooks' own BEGIN when
// BEGIN's round trip has something to carry: RunInTx's transaction id (ctx
// carries its *retry.CommitInfo) or the transaction's identity (the connection
// publishes one; transaction-local, it ends with the transaction). site is
// where the transaction began. ok is false where the driver's BeginTx
// begins it instead.
func (c *conn) beginOwn(ctx context.Context, opts driver.TxOptions, site *callsite.Stack) (t driver.Tx, ok bool, err error) {
	own := c.connector.own.Of(c.inner)
	if !own.OK() || c.queryer == nil || c.execer == nil {
		return nil, false, nil
	}
	begin := pgbegin.Clause(opts, own.PGX)
	if begin == "" {
		return nil, false, nil
	}
	info := retry.InfoOf(ctx)
	// Through pgx, a transaction at another level cannot learn its id at
	// BEGIN: RunInTx reads it before COMMIT.
	id := info != nil && (!own.IDFirst || pgbegin.DefaultLevel(opts))
	publish := c.pin.Who.Publishes
	if !id && !publish {
		return nil, false, nil
	}
	m := &c.tx.msg
	var where string
	if publish {
		where = c.connector.sites.Of(site)
	}
	if !m.Reusable(where, opts, id, publish) {
		var appName string
		if publish {
			appName = c.pin.TxAppName(where)
		}
		m.Compose(where, opts, id, publish, begin, own.IDFirst, appName)
	}
	// As for the driver's BeginTx (see conn.BeginTx): a context cancelled
	// in the middle would make pgx close the connection. COMMIT runs with
	// the same context.
	ownCtx := context.WithoutCancel(ctx)
	err = c.noteRoundTrip(m.Text, func() (err error) { // the backend's last statement (pg_loss.go)
		if m.Cols == 0 {
			_, err = c.execer.ExecContext(ownCtx, m.Text, nil)
			return err
		}
		return pgbegin.ReadID(ownCtx, c, c.queryer, m, own.Args, c.tx.row[:], info)
	})
	if err != nil {
		if pgbegin.AfterFailure(c, own, err) {
			return nil, false, nil // nothing ran: the driver begins every transaction from now on
		}
		return nil, true, c.Observe(err)
	}
	if info != nil {
		info.Begun = id
	}
	tx := c.tx.begin(ctx, pgTx{c}, opts, site)
	tx.ownCtx = ownCtx
	return tx, true, nil
}

// pgTx is a Postgres transaction that lockhooks began itself (beginOwn),
// ended by its own COMMIT and ROLLBACK (pgbegin.Commit, pgbegin.Rollback).
// Like the driver's, they run with the context BeginTx was given, minus
// its cancellation (see conn.BeginTx).
type pgTx struct{ c *conn }

// Commit commits (pgbegin.Commit).
func (t pgTx) Commit() error {
	ctx := t.c.tx.ownCtx
	if ctx == nil {
		ctx = context.Background()
	}
	return pgbegin.Commit(ctx, t.c, t.c.tx.status)
}

// Rollback rolls back (pgbegin.Rollback).
func (t pgTx) Rollback() error { return pgbegin.Rollback(t.c) }

// OwnNote is the annotation that names c as the holder of its session
// locks on lockhooks' own COMMIT and ROLLBACK (pgbegin.Conn), "" when
// there is none.
func (c *conn) OwnNote() string {
	note, _ := c.holderNote()
	return note
}

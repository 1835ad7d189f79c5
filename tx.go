package lockhooks

import (
	"context"
	"database/sql/driver"
)

// tx is the wrapped transaction. It lives inside its conn (database/sql runs
// one transaction per connection at a time), so beginning one allocates
// nothing; what must happen after COMMIT or ROLLBACK happens here.
type tx struct {
	c     *conn
	inner driver.Tx
	opts  driver.TxOptions
}

var _ driver.Tx = (*tx)(nil)

// begin starts tracking the transaction inner and returns it wrapped.
func (t *tx) begin(inner driver.Tx, opts driver.TxOptions) *tx {
	t.inner, t.opts = inner, opts
	return t
}

// Commit commits the inner transaction, then runs what waits for its end.
func (t *tx) Commit() error {
	err := t.c.observe(t.inner.Commit())
	t.end()
	return err
}

// Rollback rolls back the inner transaction, then runs what waits for its
// end. database/sql also calls it when the transaction's context ends.
func (t *tx) Rollback() error {
	err := t.c.observe(t.inner.Rollback())
	t.end()
	return err
}

// end forgets the finished transaction and, if a statement in it changed
// session locks in ways only pg_locks can tell, reads pg_locks now that
// the transaction's own locks are gone.
func (t *tx) end() {
	t.inner = nil
	t.opts = driver.TxOptions{}
	t.c.pin.mu.Lock()
	recheck := t.c.pin.recheck
	t.c.pin.mu.Unlock()
	if recheck {
		t.c.reconcile(context.Background(), "unknown")
	}
}

package pgbegin

import (
	"context"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
)

// ErrTxAborted is Commit's error for a transaction that a failed
// statement aborted, read from pgx's transaction status: it was rolled
// back. It reads as Postgres's 25P02.
var ErrTxAborted error = &txAbortedError{}

type txAbortedError struct{}

func (*txAbortedError) Error() string {
	return "lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it (in_failed_sql_transaction), and it was rolled back instead of committed"
}

// SQLState makes it classify as Postgres's in_failed_sql_transaction.
func (*txAbortedError) SQLState() string { return "25P02" }

// CommitGuarded is COMMIT after a statement that fails in an aborted
// transaction: a plain COMMIT there is answered ROLLBACK, without an
// error a driver's Exec would report.
const CommitGuarded = "SELECT 1; COMMIT"

// Commit commits a transaction lockhooks began itself on c, with ctx (the
// context BeginTx was given, minus its cancellation), failing in a
// transaction that a failed statement aborted (rolled back instead:
// ErrTxAborted, or CommitGuarded's 25P02). Through pgx (status not nil)
// the transaction's status comes from the server's last ReadyForQuery (no
// statement): COMMIT alone in a live transaction. After a failure the
// server reported, the transaction is ended, so that the connection is
// never left inside it. A connection that holds session locks keeps
// naming their holder in its last statement: the annotation leads COMMIT
// and ROLLBACK too.
func Commit(ctx context.Context, c Conn, status pgdriver.TxStatuser) error {
	text := CommitGuarded
	if status != nil {
		switch status.TxStatus() {
		case 'E': // in a failed transaction block
			if err := c.ExecOwn(context.Background(), "ROLLBACK"); err != nil {
				return err
			}
			return ErrTxAborted
		case 'T':
			text = "COMMIT"
		}
	}
	err := c.ExecOwn(ctx, c.OwnNote()+text)
	if err == nil || !dberr.FromServer(err) {
		return err
	}
	// After the guard the block is still open; after COMMIT, a no-op.
	if rerr := c.ExecOwn(context.Background(), "ROLLBACK"); rerr != nil && dberr.SQLState(err) == "25P02" {
		return fmt.Errorf("lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it (%w), and its ROLLBACK failed too: %w", err, rerr)
	}
	if dberr.SQLState(err) == "25P02" {
		return fmt.Errorf("lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it, and it was rolled back instead of committed: %w", err)
	}
	return err
}

// Rollback rolls back a transaction lockhooks began itself on c (naming
// the holder of the connection's session locks, as Commit does).
func Rollback(c Conn) error { return c.ExecOwn(context.Background(), c.OwnNote()+"ROLLBACK") }

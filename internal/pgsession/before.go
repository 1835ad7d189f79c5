package pgsession

import (
	"context"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// Before a statement: what the tracking checks of it and asks the server
// before it runs.

// KeySlices returns a Plan's Keys and Known for n calls: for the usual
// statement of one call, in one allocation.
func KeySlices[K Key](n int) ([]K, []bool) {
	if n == 1 {
		one := new(struct {
			key   [1]K
			known [1]bool
		})
		return one.key[:], one.known[:]
	}
	return make([]K, n), make([]bool, n)
}

// TakesOrFreesSession reports whether a statement takes or releases a
// session lock.
func TakesOrFreesSession(adv *sqlscan.Advisory) bool {
	for _, call := range adv.Calls {
		if call.Func&(sqlscan.FnXact|sqlscan.FnUnlockAll) == 0 {
			return true
		}
	}
	return false
}

// AnyApprox reports whether the connection holds one of keys (where
// known) with a count that may be off.
func (c *Conn[K]) AnyApprox(keys []K, known []bool) bool {
	c.Lock()
	defer c.Unlock()
	for i, k := range keys {
		if l := c.Held[k]; known[i] && l != nil && l.Approx {
			return true
		}
	}
	return false
}

// RefuseUselessXact follows transaction-level locks outside a transaction
// the caller began: when a statement calls them, the server says whether
// the connection is in a transaction block (a BEGIN sent before lockhooks
// followed the connection). Outside one, a lone statement whose only
// effect is transaction-level locks is refused: they are released as soon
// as it ends, so it protects nothing. A transaction the statement text
// opens, or one that several statements in one text make, is followed.
func (c *Conn[K]) RefuseUselessXact(ctx context.Context, adv *sqlscan.Advisory) error {
	if c.host.InTx() || adv.Statements > 1 {
		return nil
	}
	xact, all := false, true
	for _, call := range adv.Calls {
		if call.Func&sqlscan.FnXact != 0 {
			xact = true
		} else {
			all = false
		}
	}
	if !xact {
		return nil
	}
	inBlock, err := c.inTransactionBlock(ctx)
	if err != nil {
		return err
	}
	if inBlock {
		c.Lock()
		c.TextTx = true
		c.UpdateLocked()
		c.Unlock()
		return nil
	}
	if !all || !adv.TargetList {
		return nil // other effects too; its own transaction-level locks end with it
	}
	return fmt.Errorf("lockhooks: %s outside a transaction is released as soon as the statement ends, so it protects nothing; call it inside a transaction (db.BeginTx), or use a session lock (lockhooks.AcquireAdvisoryLock)", adv.Calls[0].Func.Name())
}

// inTransactionBlock asks the server whether the connection is inside a
// transaction block: SAVEPOINT fails outside one (25P01) and, inside one,
// is released at once. An aborted block (25P02) is a block too.
func (c *Conn[K]) inTransactionBlock(ctx context.Context) (bool, error) {
	err := c.host.ExecOwn(ctx, "SAVEPOINT lockhooks_probe")
	switch dberr.SQLState(err) {
	case "":
		if err != nil {
			return false, fmt.Errorf("lockhooks: checking whether %v is in a transaction block: %w", c.host, err)
		}
		return true, c.host.ExecOwn(ctx, "RELEASE SAVEPOINT lockhooks_probe")
	case "25P01":
		return false, nil
	case "25P02":
		return true, nil // an aborted block is a block
	default:
		return false, fmt.Errorf("lockhooks: checking whether %v is in a transaction block: %w", c.host, err)
	}
}

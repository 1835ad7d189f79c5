package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	"github.com/lockhooks/lockhooks/internal/rawconn"
)

// run runs text on c's connection and applies it as the tracking would,
// with results as its first row's answers (nil: none seen), and returns
// After's error.
func run(t *testing.T, ctx context.Context, c *Conn[namedKey], h *testHost, text string, results []driver.Value, verify bool) error {
	t.Helper()
	adv, keys, known := advisoryOf(text)
	plan := &Plan[namedKey]{Text: text, Site: "after.go:1", Keys: keys, Known: known, Verify: verify}
	if len(adv.Calls) > 0 || adv.DiscardAll {
		plan.Adv = adv
		plan.Exact = adv.TargetList && !adv.Uncertain
		for _, k := range known {
			plan.Exact = plan.Exact && k
		}
		c.Lock()
		c.Busy++
		c.Unlock()
	}
	err := rawconn.Exec(ctx, h.inner, text)
	return c.After(ctx, plan, results, err)
}

// After applies what a statement did: a lock taken (and the connection
// settled), an unlock, DISCARD ALL (which forgets everything and counts
// itself), and a failed lock statement, after which the server is read;
// Busy is counted out each time.
func TestAfterAppliesTheStatement(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	k := namedKey{K1: 81}
	if err := run(t, ctx, c, h, "SELECT pg_advisory_lock(81)", nil, false); err != nil {
		t.Fatal(err)
	}
	if !c.Holds(k) || !heldOnServer(t, ctx, h, k) || h.settled.Load() != 1 {
		t.Fatalf("after the lock: tracked %v, on the server %v, settled %d", c.Holds(k), heldOnServer(t, ctx, h, k), h.settled.Load())
	}
	if err := run(t, ctx, c, h, "SELECT pg_advisory_unlock(81)", []driver.Value{true}, false); err != nil {
		t.Fatal(err)
	}
	if c.Holds(k) || h.holdEnds.Load() != 1 {
		t.Fatalf("after the unlock: tracked %v, holds ended %d", c.Holds(k), h.holdEnds.Load())
	}
	run(t, ctx, c, h, "SELECT pg_advisory_lock(82)", nil, false)
	if err := run(t, ctx, c, h, "DISCARD ALL", nil, false); err != nil {
		t.Fatal(err)
	}
	if !c.HoldsNothing() || c.Discards.Load() != 1 {
		t.Fatalf("after DISCARD ALL: holds nothing %v, discards %d", c.HoldsNothing(), c.Discards.Load())
	}
	// A statement that fails: the server is read for what it holds now.
	rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_lock(83)") // behind the tracking's back
	if err := run(t, ctx, c, h, "SELECT pg_advisory_lock(1/0)", nil, false); err == nil {
		t.Fatal("a failing statement succeeded")
	}
	if !c.Holds(namedKey{K1: 83}) {
		t.Fatal("after a failed lock statement the server was not read")
	}
	c.Lock()
	busy := c.Busy
	c.Unlock()
	if busy != 0 {
		t.Fatalf("Busy is %d after the statements, want 0", busy)
	}
	rawconn.Exec(ctx, h.inner, "SELECT pg_advisory_unlock_all()")
}

// A transaction the statement text opens is followed: its
// transaction-level locks end with its COMMIT; a statement on a broken
// connection asks the host to lose the locks and returns the driver's
// error.
func TestAfterFollowsTextTransactions(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	if err := run(t, ctx, c, h, "BEGIN", nil, false); err != nil {
		t.Fatal(err)
	}
	h.inTx = true
	c.FollowTxControl("BEGIN", true, false)
	if err := run(t, ctx, c, h, "SELECT pg_advisory_xact_lock(91)", nil, false); err != nil {
		t.Fatal(err)
	}
	c.Lock()
	xact := c.Xact[namedKey{K1: 91}]
	c.Unlock()
	if xact != 1 {
		t.Fatalf("inside the text's transaction: xact count %d, want 1", xact)
	}
	rawconn.Exec(ctx, h.inner, "COMMIT")
	h.inTx = false
	c.FollowTxControl("COMMIT", false, false)
	c.Lock()
	xact, textTx := c.Xact[namedKey{K1: 91}], c.TextTx
	c.Unlock()
	if xact != 0 || textTx {
		t.Fatalf("after COMMIT: xact count %d, in a text transaction %v; want 0, false", xact, textTx)
	}
	c.Lock()
	c.AddLocked(namedKey{K1: 92}, "b.go:1", noSpan, 1)
	c.Unlock()
	plan := &Plan[namedKey]{Text: "SELECT 1"}
	if err := c.After(ctx, plan, nil, driver.ErrBadConn); !errors.Is(err, driver.ErrBadConn) || h.lost.Load() != 1 {
		t.Fatalf("a broken connection: %v, %d losses; want ErrBadConn, one loss", err, h.lost.Load())
	}
}

// A lone transaction-level lock outside any transaction is refused (it
// would protect nothing); inside a block the text began behind the
// tracking's back, the server says so and the block is followed.
func TestRefuseUselessXact(t *testing.T) {
	ctx, c, h := reconcileEnv(t, Settings{})
	lone, _, _ := advisoryOf("SELECT pg_advisory_xact_lock(1)")
	if err := c.RefuseUselessXact(ctx, lone); err == nil || !strings.Contains(err.Error(), "protects nothing") {
		t.Fatalf("a lone transaction-level lock: %v, want it refused", err)
	}
	mixed, _, _ := advisoryOf("SELECT pg_advisory_xact_lock(1), pg_advisory_lock(2)")
	if err := c.RefuseUselessXact(ctx, mixed); err != nil {
		t.Fatalf("a statement with other effects: %v", err)
	}
	rawconn.Exec(ctx, h.inner, "BEGIN")
	if err := c.RefuseUselessXact(ctx, lone); err != nil {
		t.Fatalf("inside a block: %v", err)
	}
	c.Lock()
	textTx := c.TextTx
	c.Unlock()
	if !textTx {
		t.Fatal("the block the server reported is not followed")
	}
	if err := rawconn.Exec(ctx, h.inner, "SELECT 1"); err != nil {
		t.Fatalf("the probe left the block unusable: %v", err)
	}
	rawconn.Exec(ctx, h.inner, "ROLLBACK")
	if keys, known := KeySlices[namedKey](1); len(keys) != 1 || len(known) != 1 {
		t.Fatal("KeySlices(1) is not one key")
	}
}

package callsite

import (
	"context"
	"testing"
)

// A Run is on this stack only while it runs, and only on its goroutine; a
// chain with the same context on the same goroutine is a likely self-wait,
// a certain one when its Run runs here.
func TestRunAndChain(t *testing.T) {
	if CurrentGoroutine() == 0 {
		t.Skip("goroutines cannot be told apart on this architecture")
	}
	var r Run
	r.Here()
	if r.OnThisStack() {
		t.Fatal("a Run not running is on this stack")
	}
	r.SetRunning(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := ChainOf(ctx, &r) // taken here, with ctx, in the running Run's transaction
	elsewhere := make(chan [3]bool)
	go func() {
		certain, likely := held.SelfWait(ctx)
		elsewhere <- [3]bool{r.OnThisStack(), certain, likely}
	}()
	if got := <-elsewhere; got != [3]bool{false, false, false} {
		t.Errorf("on another goroutine: on its stack, certain, likely = %v", got)
	}
	if !r.OnThisStack() {
		t.Error("a running Run is not on its own goroutine's stack")
	}
	if certain, _ := ChainOf(ctx, &r).SelfWait(context.Background()); !certain {
		t.Error("a hold of the running Run's transaction is not a certain self-wait")
	}
	r.SetRunning(false)
	certain, likely := ChainOf(ctx, &r).SelfWait(ctx)
	if certain || !likely {
		t.Errorf("the same context on the same goroutine: certain %v, likely %v; want likely only", certain, likely)
	}
	if _, likely := ChainOf(ctx, nil).SelfWait(context.Background()); likely {
		t.Error("another context is a likely self-wait")
	}
	var none *Run
	if none.OnThisStack() {
		t.Error("a nil Run is on this stack")
	}
}

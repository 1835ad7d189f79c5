package lockhooks

import (
	"runtime"
	"sync"
	"testing"
)

// currentG is stable within a goroutine and different between goroutines
// alive at the same time.
func TestCurrentGoroutine(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skipf("no goroutine identity on %s", runtime.GOARCH)
	}
	me := currentG()
	if me == 0 || currentG() != me {
		t.Fatalf("currentG: %#x then %#x", me, currentG())
	}
	const n = 50
	got := make(chan uintptr)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := currentG()
			runtime.Gosched()
			if currentG() != id {
				t.Errorf("goroutine %d: its identity changed", i)
			}
			got <- id
			<-release // all alive at once
		})
	}
	seen := map[uintptr]bool{me: true}
	for range n {
		id := <-got
		if seen[id] {
			t.Errorf("two goroutines alive at once share the identity %#x", id)
		}
		seen[id] = true
	}
	close(release)
	wg.Wait()
}

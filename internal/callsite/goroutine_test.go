package callsite

import (
	"reflect"
	"runtime"
	"sync"
	"testing"
)

// CurrentGoroutine is stable within a goroutine and different between
// goroutines alive at the same time.
func TestCurrentGoroutine(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skipf("no goroutine identity on %s", runtime.GOARCH)
	}
	me := CurrentGoroutine()
	if me == 0 || CurrentGoroutine() != me {
		t.Fatalf("CurrentGoroutine: %#x then %#x", me, CurrentGoroutine())
	}
	const n = 50
	got := make(chan uintptr)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := CurrentGoroutine()
			runtime.Gosched()
			if CurrentGoroutine() != id {
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

//go:noinline
func nestedCapture(depth int, fast bool) (c Stack) {
	if depth > 0 {
		return nestedCapture(depth-1, fast)
	}
	if fast {
		c.CaptureFast()
	} else {
		c.n = runtime.Callers(1, c.pcs[:]) // from this function, as CaptureFast
	}
	return c
}

// CaptureFast records the frames runtime.Callers records.
func TestCaptureFastMatchesCallers(t *testing.T) {
	for _, depth := range []int{0, 3, 20} {
		fast, slow := nestedCapture(depth, true), nestedCapture(depth, false)
		frames := func(c Stack) []string {
			var out []string
			fs := runtime.CallersFrames(c.pcs[:c.n])
			for {
				f, more := fs.Next()
				out = append(out, f.Function)
				if !more {
					return out
				}
			}
		}
		ff, sf := frames(fast), frames(slow)
		if len(ff) == 0 || ff[0] != sf[0] {
			t.Fatalf("depth %d: fast %v, runtime.Callers %v", depth, ff, sf)
		}
		for i := range min(len(ff), len(sf), depth+2) { // up to the test (the runtime elides wrappers below it)
			if ff[i] != sf[i] && FastCapture {
				t.Errorf("depth %d, frame %d: fast %s, runtime.Callers %s", depth, i, ff[i], sf[i])
			}
		}
	}
}

func BenchmarkCapture(b *testing.B) {
	for _, fast := range []bool{false, true} {
		name := "runtime.Callers"
		if fast {
			name = "frame pointers"
		}
		b.Run(name, func(b *testing.B) {
			var c Stack
			for b.Loop() {
				if fast {
					c.CaptureFast()
				} else {
					c.Capture()
				}
			}
		})
	}
}

//go:noinline
func deepCapture(n int, pad [64]byte, f func()) byte {
	if n == 0 {
		f()
		return pad[0]
	}
	var big [512]byte
	big[n%512] = byte(n)
	return deepCapture(n-1, pad, f) + big[(n*7)%512]
}

// Captures from deep, growing stacks, under panics, reflect calls and
// concurrent GC (stack shrinking) keep returning frames of this test.
func TestCaptureFastUnderStackGrowthAndGC(t *testing.T) {
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	defer close(stop)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 300 {
				depth := (i*13 + w) % 200
				var c Stack
				capture := func() { c.CaptureFast() }
				switch i % 3 {
				case 0:
					deepCapture(depth, [64]byte{}, capture)
				case 1:
					reflect.ValueOf(func() { deepCapture(depth, [64]byte{}, capture) }).Call(nil)
				case 2:
					func() {
						defer func() { recover(); deepCapture(depth, [64]byte{}, capture) }()
						panic("x")
					}()
				}
				if c.n == 0 {
					t.Errorf("no frames")
					return
				}
				fs := runtime.CallersFrames(c.pcs[:c.n])
				f, _ := fs.Next()
				if f.Function == "" {
					t.Errorf("frame 0 unknown: %#x", c.pcs[0])
					return
				}
			}
		})
	}
	wg.Wait()
}

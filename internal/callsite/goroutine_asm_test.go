//go:build amd64 || arm64

package callsite

import (
	"runtime"
	"slices"
	"testing"
	"unsafe"
)

// The frame-pointer walk never leaves the goroutine's stack: a chain that
// goes on past the stack's end (C frames below a cgo callback leave
// anything in the frame-pointer register) is cut at the end, and a step
// down stops it. The fake stack is a slice of words: each frame is a
// saved frame pointer and a return address above it.
func TestWalkFramesStaysInsideTheStack(t *testing.T) {
	words := make([]uintptr, 16)
	addr := func(i int) uintptr { return uintptr(unsafe.Pointer(&words[i])) }
	// Frames at words 0, 4 and 8; the one at 8 links to 12, beyond the
	// stack's end (hi = word 10), whose return address is a valid-looking 0x3.
	words[0], words[1] = addr(4), 0x1
	words[4], words[5] = addr(8), 0x2
	words[8], words[9] = addr(12), 0x3
	words[12], words[13] = addr(14), 0x4
	var pcs [24]uintptr
	n := walkFrames(&pcs, unsafe.Pointer(&words[0]), addr(10))
	if got := pcs[:n]; !slices.Equal(got, []uintptr{1, 2, 3}) {
		t.Fatalf("walk inside [words[0], words[10]): %#x, want 0x1 0x2 0x3 (stop before the frame past the stack's end)", got)
	}
	n = walkFrames(&pcs, unsafe.Pointer(&words[0]), addr(15)+unsafe.Sizeof(uintptr(0)))
	if got := pcs[:n]; !slices.Equal(got, []uintptr{1, 2, 3, 4}) {
		t.Fatalf("walk inside the whole slice: %#x, want 0x1 … 0x4", got)
	}
	words[4] = addr(2) // a step down
	n = walkFrames(&pcs, unsafe.Pointer(&words[0]), addr(15))
	if got := pcs[:n]; !slices.Equal(got, []uintptr{1, 2}) {
		t.Fatalf("walk with a step down: %#x, want 0x1 0x2", got)
	}
}

// stackBounds reads the running goroutine's stack: a local variable lies
// inside it, also after the stack grew.
func TestStackBounds(t *testing.T) {
	if CurrentGoroutine() == 0 {
		t.Skipf("SKIP: no goroutine identity on %s", runtime.GOARCH)
	}
	check := func(when string) {
		var local int
		lo, hi := stackBounds()
		p := uintptr(unsafe.Pointer(&local))
		if !(lo < p && p < hi) {
			t.Fatalf("%s: a local at %#x outside the stack [%#x, %#x)", when, p, lo, hi)
		}
	}
	check("at first")
	var grow func(n int) byte
	grow = func(n int) byte {
		var pad [1024]byte
		if n == 0 {
			check("after growing")
			return pad[0]
		}
		return grow(n-1) + pad[n%1024]
	}
	grow(64)
}

package lockhooks

import (
	"testing"
	"unsafe"
)

// A lock wait is one allocation of lockWait; the runtime adds an 8-byte
// header to objects over 512 bytes that hold pointers, and rounds up to a
// size class. The record fit the 576-byte class before internal/telemetry
// (568 bytes): a field more must be paid for somewhere else.
func TestLockWaitFitsItsSizeClass(t *testing.T) {
	if size := unsafe.Sizeof(lockWait{}); size+8 > 576 {
		t.Errorf("lockWait is %d bytes: with its allocation header it no longer fits the 576-byte size class", size)
	}
}

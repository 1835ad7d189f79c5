#include "textflag.h"

// func CurrentGoroutine() uintptr
TEXT ·CurrentGoroutine(SB),NOSPLIT,$0-8
	MOVQ (TLS), AX
	MOVQ AX, ret+0(FP)
	RET

// func callerFP() unsafe.Pointer
TEXT ·callerFP(SB),NOSPLIT|NOFRAME,$0-8
	MOVQ BP, ret+0(FP)
	RET

// func stackBounds() (lo, hi uintptr)
TEXT ·stackBounds(SB),NOSPLIT,$0-16
	MOVQ (TLS), AX
	MOVQ 0(AX), BX // g.stack.lo
	MOVQ 8(AX), CX // g.stack.hi
	MOVQ BX, lo+0(FP)
	MOVQ CX, hi+8(FP)
	RET

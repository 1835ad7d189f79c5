#include "textflag.h"

// func currentG() uintptr
TEXT ·currentG(SB),NOSPLIT,$0-8
	MOVQ (TLS), AX
	MOVQ AX, ret+0(FP)
	RET

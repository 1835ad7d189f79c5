// Package callsite captures where the application called lockhooks from,
// cheaply, and names it.
//
// Its one job: record a call stack without allocating (a [Stack] of 24
// return addresses, or a [Trail] of 48 for the lock-order checker), and
// name it later as file:line of the first frame that is the application's:
// not database/sql's, not the runtime's, not a compiler-generated wrapper
// and not lockhooks' own (any package of module github.com/lockhooks/lockhooks,
// except its _test.go files, which are users of lockhooks like any other).
// Where frame pointers can be walked (amd64, arm64), [Stack.CaptureFast]
// records the stack in a few nanoseconds a frame, and [CurrentGoroutine]
// names the running goroutine, both in assembly. On that identity rest the
// self-wait checks' values: a function that runs on one goroutine while
// its transactions are open ([Run]: RunInTx's fn) and who holds a lock
// ([Chain]: the context, goroutine and Run it took it with).
//
// State: none of its own. A [Names] cache, which symbolises each return
// address once, belongs to its caller (lockhooks keeps one per database).
//
// Imports: nothing of lockhooks'; only the standard library.
package callsite

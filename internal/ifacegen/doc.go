// Command ifacegen writes ifaces_gen.go: the functions that give a wrapped
// connection, statement or rows value exactly the optional database/sql/driver
// interfaces of the value it wraps.
//
// database/sql decides what a driver can do by type assertions, so a wrapper
// that implements an optional interface the inner driver lacks changes
// behaviour (and one that drops an interface loses a feature). Go cannot add
// methods to a type at run time, so each combination gets a struct literal
// whose embedded interface fields carry exactly the chosen methods.
//
// Run it with `go generate` in the module root; it also writes the test
// doubles' pickers to ifaces_fake_gen_test.go.
//
// It imports nothing of lockhooks' (it writes source text).
package main

// Package driverext lets lockhooks' driver-specific subpackages give the
// wrapped driver the driver-level optional interfaces of the inner driver
// that the root package cannot name without importing that driver (such as
// modernc.org/sqlite/vtab.ModuleRegisterer).
//
// It owns the list of registered decorators (filled by the subpackages'
// init functions, the one kind of global state sql.Register-style wiring
// forces). It imports nothing of lockhooks' (the standard library's
// database/sql/driver only).
package driverext

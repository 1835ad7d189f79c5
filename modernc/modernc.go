// Package modernc forwards the driver-level optional interfaces of
// modernc.org/sqlite through lockhooks' wrapped driver. Import it for its
// side effect wherever lockhooks wraps a modernc driver:
//
//	import _ "github.com/lockhooks/lockhooks/modernc"
//
// Then a wrapped modernc driver implements vtab.ModuleRegisterer exactly
// when the inner driver does, so vtab.RegisterModule(db, name, m) on a
// database opened through lockhooks registers the module on the driver
// that database connects through, as it does without lockhooks (for a
// driver of one's own, sql.Register("mine", &sqlite.Driver{}), instead of
// process-wide). The root package stays free of modernc imports; this
// package imports only modernc.org/sqlite/vtab, which depends on nothing
// but the standard library.
package modernc

import (
	"database/sql/driver"

	"modernc.org/sqlite/vtab"

	"github.com/lockhooks/lockhooks"
	"github.com/lockhooks/lockhooks/internal/driverext"
)

func init() { driverext.Register(decorate) }

// decorate gives w the ModuleRegisterer of inner, when inner has one.
func decorate(w, inner driver.Driver) driver.Driver {
	r, ok := inner.(vtab.ModuleRegisterer)
	if !ok {
		return nil
	}
	d, ok := w.(*lockhooks.Driver)
	if !ok {
		return nil
	}
	return &moduleDriver{Driver: d, r: r}
}

// moduleDriver is lockhooks' driver with the inner driver's
// ModuleRegisterer.
type moduleDriver struct {
	*lockhooks.Driver
	r vtab.ModuleRegisterer
}

var _ vtab.ModuleRegisterer = (*moduleDriver)(nil)

// RegisterModule registers a virtual table module on the inner driver, so
// it reaches the connections lockhooks opens through it.
func (d *moduleDriver) RegisterModule(name string, m vtab.Module) error {
	return d.r.RegisterModule(name, m)
}

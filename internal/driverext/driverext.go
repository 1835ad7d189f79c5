package driverext

import (
	"database/sql/driver"
	"sync"
)

// A Decorator returns w, lockhooks' wrapper of inner, as a value that also
// has the optional interfaces inner has among those the decorator knows, or
// nil when inner has none of them.
type Decorator func(w, inner driver.Driver) driver.Driver

var (
	mu         sync.RWMutex
	decorators []Decorator
)

// Register adds a decorator; subpackages call it from init.
func Register(d Decorator) {
	mu.Lock()
	defer mu.Unlock()
	decorators = append(decorators, d)
}

// Decorate returns w with the optional interfaces of inner that a
// registered decorator knows: the first decorator that applies wins. It
// returns w itself when none applies.
func Decorate(w, inner driver.Driver) driver.Driver {
	mu.RLock()
	defer mu.RUnlock()
	for _, d := range decorators {
		if v := d(w, inner); v != nil {
			return v
		}
	}
	return w
}

package lockhooks

import (
	"context"

	"github.com/lockhooks/lockhooks/internal/callsite"
)

// callSiteKey carries the user's call site into the hooks.
type callSiteKey struct{}

// siteOf returns the call site recorded in ctx, or finds it.
func siteOf(ctx context.Context) string {
	if s, ok := ctx.Value(callSiteKey{}).(string); ok {
		return s
	}
	return callsite.Here()
}

// Site returns the call site recorded in ctx, or finds it, naming it
// through the database's callsite.Names: a statement's site costs no
// allocation once its return addresses were seen.
func (c *conn) Site(ctx context.Context) string {
	if s, ok := ctx.Value(callSiteKey{}).(string); ok {
		return s
	}
	var cs callsite.Stack
	cs.CaptureFast() // (runtime.Callers costs microseconds a statement)
	return c.connector.sites.Of(&cs)
}

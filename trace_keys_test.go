package lockhooks

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// The exported attribute keys are the ones internal/telemetry records:
// the root states them for its users, the package for its spans.
func TestAttributeKeys(t *testing.T) {
	for _, k := range []struct{ root, recorded attribute.Key }{
		{AttrLockKind, telemetry.AttrLockKind},
		{AttrLockMode, telemetry.AttrLockMode},
		{AttrLockScope, telemetry.AttrLockScope},
		{AttrLockNamespace, telemetry.AttrLockNamespace},
		{AttrLockKeys, telemetry.AttrLockKeys},
		{AttrLockOutcome, telemetry.AttrLockOutcome},
		{AttrLockNoWait, telemetry.AttrLockNoWait},
		{AttrLockSkipLocked, telemetry.AttrLockSkipLocked},
		{AttrBackendPID, telemetry.AttrBackendPID},
		{AttrHolderSite, telemetry.AttrHolderSite},
		{AttrHolderSince, telemetry.AttrHolderSince},
		{AttrHolderPID, telemetry.AttrHolderPID},
		{AttrHolderPool, telemetry.AttrHolderPool},
		{AttrHolderConn, telemetry.AttrHolderConn},
		{AttrHolderProcess, telemetry.AttrHolderProcess},
		{AttrHolderHeldSeconds, telemetry.AttrHolderHeldSeconds},
		{AttrHolderDescription, telemetry.AttrHolderDescription},
	} {
		if k.root != k.recorded {
			t.Errorf("the root exports %q, internal/telemetry records %q", k.root, k.recorded)
		}
	}
}

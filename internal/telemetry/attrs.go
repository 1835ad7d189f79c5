package telemetry

import "go.opentelemetry.io/otel/attribute"

// InstrumentationName names lockhooks' meter and tracer.
const InstrumentationName = "github.com/lockhooks/lockhooks"

// Attribute keys: lockhooks' own namespace (the root package exports them
// under the same names), and OpenTelemetry's database conventions.
const (
	AttrLockKind          = attribute.Key("lockhooks.lock.kind")
	AttrLockMode          = attribute.Key("lockhooks.lock.mode")
	AttrLockScope         = attribute.Key("lockhooks.lock.scope")
	AttrLockNamespace     = attribute.Key("lockhooks.lock.namespace")
	AttrLockKeys          = attribute.Key("lockhooks.lock.keys")
	AttrLockOutcome       = attribute.Key("lockhooks.lock.outcome")
	AttrLockNoWait        = attribute.Key("lockhooks.lock.nowait")
	AttrLockSkipLocked    = attribute.Key("lockhooks.lock.skip_locked")
	AttrBackendPID        = attribute.Key("lockhooks.conn.backend_pid")
	AttrHolderSite        = attribute.Key("lockhooks.holder.call_site")
	AttrHolderSince       = attribute.Key("lockhooks.holder.since")
	AttrHolderPID         = attribute.Key("lockhooks.holder.backend_pid")
	AttrHolderPool        = attribute.Key("lockhooks.holder.pool.name")
	AttrHolderConn        = attribute.Key("lockhooks.holder.connection")
	AttrHolderProcess     = attribute.Key("lockhooks.holder.process")
	AttrHolderHeldSeconds = attribute.Key("lockhooks.holder.held_seconds")
	AttrHolderDescription = attribute.Key("lockhooks.holder.description")

	// AttrPoolName and AttrDBSystem are on every metric (and AttrDBSystem on
	// every span): the database's pool name and its system.
	AttrPoolName    = attribute.Key("db.client.connection.pool.name")
	AttrDBSystem    = attribute.Key("db.system.name")
	attrDBStatus    = attribute.Key("db.response.status_code")
	attrErrorType   = attribute.Key("error.type")
	attrDBQueryText = attribute.Key("db.query.text")
)

// Outcomes of a lock acquisition (the lockhooks.lock.outcome attribute).
const (
	OutcomeAcquired    = "acquired"
	OutcomeNotAcquired = "not_acquired"
	OutcomeTimeout     = "timeout"
	OutcomeDeadlock    = "deadlock"
	OutcomeCanceled    = "canceled"
	OutcomeLost        = "lost"
	OutcomeError       = "error"
)

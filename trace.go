package lockhooks

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instrumentationName names lockhooks' meter and tracer.
const instrumentationName = "github.com/lockhooks/lockhooks"

// Attribute keys of the lockhooks.* namespace.
const (
	attrLockKind  = attribute.Key("lockhooks.lock.kind")
	attrLockScope = attribute.Key("lockhooks.lock.scope")
	attrDBSystem  = attribute.Key("db.system.name")
)

// WithMeterProvider sets where lockhooks' metrics go; the default is
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meterProvider = mp }
}

// instruments are the metrics of one wrapped database.
type instruments struct {
	rerouted metric.Int64Counter // lockhooks.advisory.unlocks_rerouted
	lost     metric.Int64Counter // lockhooks.lock.lost
	reg      metric.Registration // the observable gauges' callback
	attrs    metric.MeasurementOption
}

// newInstruments creates the metrics; observe is called at each collection
// for the gauges. Instrument errors fall back to no-op instruments: telemetry
// never breaks the database.
func newInstruments(o *options, observe func() (held, parked int64)) *instruments {
	mp := o.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	system := "postgresql"
	if o.dialect == SQLite {
		system = "sqlite"
	}
	ins := &instruments{attrs: metric.WithAttributeSet(attribute.NewSet(attrDBSystem.String(system)))}
	var err error
	if ins.rerouted, err = m.Int64Counter("lockhooks.advisory.unlocks_rerouted",
		metric.WithDescription("Advisory unlocks run on the parked connection that held the lock instead of the connection they were sent on."),
		metric.WithUnit("{unlock}")); err != nil {
		otel.Handle(err)
	}
	if ins.lost, err = m.Int64Counter("lockhooks.lock.lost",
		metric.WithDescription("Locks lost because the connection holding them died."),
		metric.WithUnit("{lock}")); err != nil {
		otel.Handle(err)
	}
	held, err1 := m.Int64ObservableGauge("lockhooks.advisory.held_locks",
		metric.WithDescription("Session advisory locks held by connections of this database (active or parked)."),
		metric.WithUnit("{lock}"))
	parked, err2 := m.Int64ObservableGauge("lockhooks.advisory.parked_connections",
		metric.WithDescription("Connections withdrawn from the pool because they hold session advisory locks."),
		metric.WithUnit("{connection}"))
	if err1 == nil && err2 == nil {
		ins.reg, err = m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
			h, p := observe()
			obs.ObserveInt64(held, h, ins.attrs)
			obs.ObserveInt64(parked, p, ins.attrs)
			return nil
		}, held, parked)
		if err != nil {
			otel.Handle(err)
		}
	}
	return ins
}

// lockLost counts lost locks of a kind.
func (ins *instruments) lockLost(ctx context.Context, kind string, n int) {
	if ins.lost != nil && n > 0 {
		ins.lost.Add(ctx, int64(n), ins.attrs, metric.WithAttributes(attrLockKind.String(kind), attrLockScope.String("session")))
	}
}

// unlockRerouted counts one rerouted unlock.
func (ins *instruments) unlockRerouted(ctx context.Context) {
	if ins.rerouted != nil {
		ins.rerouted.Add(ctx, 1, ins.attrs)
	}
}

// close unregisters the gauges' callback.
func (ins *instruments) close() {
	if ins.reg != nil {
		ins.reg.Unregister()
	}
}

package ingest

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/meta"
	"devicehub/meta/cache"
	"devicehub/schema"
	"devicehub/tsdb"
)

// ModelReader reads the thing model in force for a product's devices (or
// for one device with a model of its own) and its product's outside-model
// policy; *meta.Store is one. Devices that implement it have their
// reported values checked against their thing model (modelCache).
type ModelReader interface {
	ModelPolicy(ctx context.Context, productID, deviceID string) (meta.ModelPolicy, error)
}

// Actions on a value outside the thing model, the action label of
// devicehub_ingest_outside_model_values_total.
const (
	outsideKept    = "kept"
	outsideDropped = "dropped"
)

// modelKey names a thing model in force: a product's (device ""), or a
// device's own.
type modelKey struct{ product, device string }

// checkedModel is a thing model as values are checked against it.
type checkedModel struct {
	model *schema.ThingModel
	types map[string]*schema.ValueType // top-level property id -> its type
	drop  bool                         // the product's policy is meta.OutsideDrop
}

// modelCache checks reported property values against the thing model in
// force and applies the product's outside-model policy (keep: stored and
// counted; drop: counted, not stored). A value is outside when
// schema.ThingModel.Outside says so: an undeclared property, an enum
// value none of its elements has, a value of another type.
//
// The models are kept in a meta/cache Cache, one per product (and one per
// device with a model of its own: meta.DeviceStatus.OwnModel, which the
// device cache refreshes), loaded once and then refreshed in the
// background every ttl (the device cache's TTL) while used, so that a
// message costs no PostgreSQL query and a change of a product's model or
// policy (or a device's own model) takes effect within about ttl, as a
// deploy or undeploy does. While a model cannot be read (PostgreSQL away
// before it was first read), values are stored unchecked and not counted:
// the API marks values against the current model when they are read.
type modelCache struct {
	src     ModelReader
	log     *slog.Logger
	models  *cache.Cache[modelKey, *checkedModel]
	counts  *prometheus.CounterVec
	counter map[[2]string]prometheus.Counter // {reason, action}
	failing atomic.Bool                      // a load failed since the last success (logged once)
}

func newModelCache(src ModelReader, ttl, keep time.Duration, log *slog.Logger) *modelCache {
	o := cache.DefaultOptions[modelKey, *checkedModel]()
	o.TTL = ttl
	o.Stale = max(keep, ttl) // served while refreshed; unused ones go after keep
	o.MaxEntries = 1 << 16   // products, and devices with models of their own
	o.LoadTimeout = 0        // the store's own (meta's QueryTimeout)
	mc := &modelCache{src: src, log: log, models: cache.New(o), counter: make(map[[2]string]prometheus.Counter),
		counts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_ingest_outside_model_values_total",
			Help: "Reported property values outside the device's thing model (undeclared, not_in_enum, wrong_type), by what the product's outsideModelPolicy did with them (kept, dropped)."},
			[]string{"reason", "action"})}
	for _, r := range schema.OutsideReasons {
		for _, a := range []string{outsideKept, outsideDropped} {
			mc.counter[[2]string{r, a}] = mc.counts.WithLabelValues(r, a)
		}
	}
	return mc
}

// load reads a thing model in force.
func (mc *modelCache) load(ctx context.Context, k modelKey) (*checkedModel, error) {
	mp, err := mc.src.ModelPolicy(ctx, k.product, k.device)
	if err != nil {
		return nil, err
	}
	m, err := schema.ParseThingModelString(mp.Metadata)
	if err != nil { // a stored model is valid; were it not, nothing is declared
		m = schema.EmptyThingModel()
	}
	cm := &checkedModel{model: m, types: make(map[string]*schema.ValueType, len(m.Properties)), drop: mp.Policy == meta.OutsideDrop}
	for i := range m.Properties {
		cm.types[m.Properties[i].ID] = &m.Properties[i].ValueType
	}
	return cm, nil
}

// check counts the values of props outside the thing model in force for
// device st/id and returns props without them when its product drops
// them (the same backing array: props is the worker's own).
func (mc *modelCache) check(ctx context.Context, id string, st meta.DeviceStatus, props []tsdb.PropertyValue) []tsdb.PropertyValue {
	k := modelKey{product: st.ProductID}
	if st.OwnModel {
		k.device = id
	}
	cm, err := mc.models.Get(ctx, k, mc.load)
	if err != nil {
		if ctx.Err() == nil && !mc.failing.Swap(true) {
			mc.log.Warn("thing model lookup failed; storing values unchecked", "product", k.product, "device", id, "err", err)
		}
		return props
	}
	if mc.failing.Load() {
		mc.failing.Store(false)
	}
	out := props[:0]
	for _, p := range props {
		var reason string
		if vt, ok := cm.types[p.Property]; !ok {
			reason = schema.OutsideUndeclared
		} else {
			reason = vt.Outside(reportedValue(&p))
		}
		if reason == "" {
			out = append(out, p)
			continue
		}
		if cm.drop {
			mc.counter[[2]string{reason, outsideDropped}].Inc()
			continue
		}
		mc.counter[[2]string{reason, outsideKept}].Inc()
		out = append(out, p)
	}
	return out
}

// reportedValue is a decoded value as the device's JSON had it, as
// schema.ValueType.Outside takes it.
func reportedValue(p *tsdb.PropertyValue) any {
	switch p.ValueType {
	case "number":
		return p.Num
	case "bool":
		return p.Num != 0
	case "json":
		return json.RawMessage(p.Str)
	}
	return p.Str
}

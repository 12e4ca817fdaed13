package dashboard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/schema"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// TestHistoryResolve: a history query is resolved against its device
// as looked up: the device's product must be the query's, and the thing
// model counts the properties of a query that names none.
func TestHistoryResolve(t *testing.T) {
	t.Parallel()
	model := `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}},{"id":"hum","name":"Humidity","valueType":{"type":"int"}}],"events":[],"functions":[],"tags":[]}`
	q := tsdb.HistoryQuery{ProductID: "p", DeviceID: "d", N: 3}
	_, err := resolveHistory(q, meta.DeviceRef{ProductID: "other", Metadata: model})
	var ae *schema.ArgError
	if !errors.As(err, &ae) || ae.Field != "object" || !strings.Contains(ae.Msg, `device "d" belongs to product "other", not "p"`) {
		t.Fatalf("another product's device: %v", err)
	}
	h, err := resolveHistory(q, meta.DeviceRef{ProductID: "p", Metadata: model})
	if err != nil || h.Properties != 2 || h.Query.N != 3 || h.Query.DeviceID != "d" {
		t.Fatalf("every property: %+v, %v", h, err)
	}
	if def, ok := h.Model.Property("hum"); !ok || def.Name != "Humidity" {
		t.Fatalf("the model: %+v %v", def, ok)
	}
	q.Properties = []string{"temp"}
	if h, err = resolveHistory(q, meta.DeviceRef{ProductID: "p", Metadata: model}); err != nil || h.Properties != 1 {
		t.Fatalf("one property: %+v, %v", h, err)
	}
	q.Properties = nil
	if h, err = resolveHistory(q, meta.DeviceRef{ProductID: "p", Metadata: "not a model"}); err != nil || h.Properties != 0 || h.Model == nil {
		t.Fatalf("a model that does not parse: %+v, %v", h, err)
	}
}

// TestHistoryRun: a resolved history runs as the latest values
// (PropertyHistory, its From and To unused) or, Bounded, as the values of
// its range (HistoryRange); its ExportQuery streams the same range.
func TestHistoryRun(t *testing.T) {
	t.Parallel()
	db := tsdbtest.NewDB(t, time.UTC)
	ctx := context.Background()
	base := time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)
	var ps []tsdb.PropertyValue
	for i := range 4 {
		ps = append(ps, tsdb.PropertyValue{Time: base.Add(time.Duration(i) * time.Second), ProductID: "hrun_p", DeviceID: "d1",
			Property: "temp", ValueType: "number", Num: float64(i)})
	}
	if err := db.Insert(ctx, nil, ps); err != nil {
		t.Fatal(err)
	}
	run := func(q tsdb.HistoryQuery, want string) history {
		t.Helper()
		q.ProductID, q.DeviceID, q.Properties = "hrun_p", "d1", []string{"temp"}
		h, err := resolveHistory(q, meta.DeviceRef{ProductID: "hrun_p"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.run(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if numbersText(got) != want {
			t.Fatalf("%+v:\n got %s\nwant %s", q, numbersText(got), want)
		}
		return h
	}
	run(tsdb.HistoryQuery{N: 2}, "temp=2 temp=3")
	run(tsdb.HistoryQuery{N: 2, To: base.Add(2 * time.Second)}, "temp=2 temp=3") // not Bounded: the latest
	run(tsdb.HistoryQuery{N: 2, To: base.Add(2 * time.Second), Bounded: true}, "temp=0 temp=1")
	h := run(tsdb.HistoryQuery{N: 5, From: base.Add(time.Second), To: base.Add(3 * time.Second), Bounded: true}, "temp=1 temp=2")
	h.Query.N = 0 // an export's: every value of the range
	e, err := db.PrepareExport(ctx, h.exportQuery())
	if err != nil {
		t.Fatal(err)
	}
	var streamed []tsdb.PropertyValue
	if err := e.Each(ctx, func(v *tsdb.PropertyValue) error { streamed = append(streamed, *v); return nil }); err != nil {
		t.Fatal(err)
	}
	if numbersText(streamed) != "temp=1 temp=2" {
		t.Fatalf("export of %+v: %s", h.exportQuery(), numbersText(streamed))
	}
}

// TestAggResolve: a property aggregate query is resolved against the
// thing model handed in: a device of another product is refused on
// object, a property the model lacks or that is not numeric on its index
// as sent, and the model is handed back.
func TestAggResolve(t *testing.T) {
	t.Parallel()
	model := `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}},{"id":"label","name":"Label","valueType":{"type":"string"}}],"events":[],"functions":[],"tags":[]}`
	f := func(q tsdb.AggQuery, m aggModel, sent []string, field, msg string) {
		t.Helper()
		got, err := resolveAgg(&q, m, sent)
		if field == "" {
			if err != nil || got == nil {
				t.Fatalf("%+v: %v", q, err)
			}
			if def, ok := got.Property("temp"); m.Metadata == model && (!ok || def.Name != "Temperature") {
				t.Fatalf("%+v: the model: %+v %v", q, def, ok)
			}
			return
		}
		var ae *schema.ArgError
		if !errors.As(err, &ae) || ae.Field != field || !strings.Contains(ae.Msg, msg) {
			t.Fatalf("%+v: got %v, want %s: %s", q, err, field, msg)
		}
	}
	dev := tsdb.AggQuery{ProductID: "p", DeviceID: "d", Properties: []string{"temp"}, Agg: tsdb.AggAvg}
	f(dev, aggModel{ProductID: "p", Metadata: model}, nil, "", "")
	f(dev, aggModel{ProductID: "other", Metadata: model}, nil, "object", `device "d" belongs to product "other", not "p"`)
	prod := tsdb.AggQuery{ProductID: "p", Properties: []string{"temp"}, Agg: tsdb.AggMax}
	f(prod, aggModel{ProductID: "p", Metadata: model}, nil, "", "")
	f(tsdb.AggQuery{ProductID: "p", Properties: []string{"temp", "nope"}}, aggModel{ProductID: "p", Metadata: model}, nil,
		"params.properties[1]", `property "nope" is not in the thing model of product "p"`)
	f(tsdb.AggQuery{ProductID: "p", DeviceID: "d", Properties: []string{"label"}}, aggModel{ProductID: "p", Metadata: model}, nil,
		"params.properties[0]", `property "label" is of type string; aggregates need int, long, float or double`)
	// Repeats were dropped from Properties; errors name the index as sent.
	f(tsdb.AggQuery{ProductID: "p", Properties: []string{"temp", "label"}}, aggModel{ProductID: "p", Metadata: model}, []string{"temp", "temp", "label"},
		"params.properties[2]", `property "label" is of type string`)
	// A model that does not parse counts as empty.
	f(prod, aggModel{ProductID: "p", Metadata: "{"}, nil, "params.properties[0]", `property "temp" is not in the thing model of product "p"`)
}

// numbersText is values as "property=value ..." (as tsdb's tests write them).
func numbersText(vs []tsdb.PropertyValue) string {
	var s []string
	for _, v := range vs {
		s = append(s, fmt.Sprintf("%s=%g", v.Property, v.Num))
	}
	return strings.Join(s, " ")
}

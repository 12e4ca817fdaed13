package tsdb

import (
	"errors"
	"strings"
	"testing"
	"time"

	"devicehub/schema"
)

// TestHistoryResolve: a history query is resolved against the device
// handed in: the device's product must be the query's, and the thing
// model counts the properties of a query that names none.
func TestHistoryResolve(t *testing.T) {
	model := `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}},{"id":"hum","name":"Humidity","valueType":{"type":"int"}}],"events":[],"functions":[],"tags":[]}`
	q := HistoryQuery{ProductID: "p", DeviceID: "d", N: 3}
	_, err := q.Resolve(HistoryDevice{ProductID: "other", Metadata: model})
	var ae *schema.ArgError
	if !errors.As(err, &ae) || ae.Field != "object" || !strings.Contains(ae.Msg, `device "d" belongs to product "other", not "p"`) {
		t.Fatalf("another product's device: %v", err)
	}
	h, err := q.Resolve(HistoryDevice{ProductID: "p", Metadata: model})
	if err != nil || h.Properties != 2 || h.Query.N != 3 || h.Query.DeviceID != "d" {
		t.Fatalf("every property: %+v, %v", h, err)
	}
	if def, ok := h.Model.Property("hum"); !ok || def.Name != "Humidity" {
		t.Fatalf("the model: %+v %v", def, ok)
	}
	q.Properties = []string{"temp"}
	if h, err = q.Resolve(HistoryDevice{ProductID: "p", Metadata: model}); err != nil || h.Properties != 1 {
		t.Fatalf("one property: %+v, %v", h, err)
	}
	q.Properties = nil
	if h, err = q.Resolve(HistoryDevice{ProductID: "p", Metadata: "not a model"}); err != nil || h.Properties != 0 || h.Model == nil {
		t.Fatalf("a model that does not parse: %+v, %v", h, err)
	}
}

// TestHistoryRun: a resolved history runs as the latest values
// (PropertyHistory, its From and To unused) or, Bounded, as the values of
// its range (HistoryRange); its ExportQuery streams the same range.
func TestHistoryRun(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	base := sh(t, "2024-06-01 08:00:00")
	var ps []PropertyValue
	for i := range 4 {
		ps = append(ps, PropertyValue{Time: base.Add(time.Duration(i) * time.Second), ProductID: "hrun_p", DeviceID: "d1",
			Property: "temp", ValueType: "number", Num: float64(i)})
	}
	if err := db.Insert(ctx, nil, ps); err != nil {
		t.Fatal(err)
	}
	run := func(q HistoryQuery, want string) History {
		t.Helper()
		q.ProductID, q.DeviceID, q.Properties = "hrun_p", "d1", []string{"temp"}
		h, err := q.Resolve(HistoryDevice{ProductID: "hrun_p"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.Run(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if numbersText(got) != want {
			t.Fatalf("%+v:\n got %s\nwant %s", q, numbersText(got), want)
		}
		return h
	}
	run(HistoryQuery{N: 2}, "temp=2 temp=3")
	run(HistoryQuery{N: 2, To: base.Add(2 * time.Second)}, "temp=2 temp=3") // not Bounded: the latest
	run(HistoryQuery{N: 2, To: base.Add(2 * time.Second), Bounded: true}, "temp=0 temp=1")
	h := run(HistoryQuery{N: 5, From: base.Add(time.Second), To: base.Add(3 * time.Second), Bounded: true}, "temp=1 temp=2")
	h.Query.N = 0 // an export's: every value of the range
	e, err := db.PrepareExport(ctx, h.ExportQuery())
	if err != nil {
		t.Fatal(err)
	}
	var streamed []PropertyValue
	if err := e.Each(ctx, func(v *PropertyValue) error { streamed = append(streamed, *v); return nil }); err != nil {
		t.Fatal(err)
	}
	if numbersText(streamed) != "temp=1 temp=2" {
		t.Fatalf("export of %+v: %s", h.ExportQuery(), numbersText(streamed))
	}
}

// TestAggResolve: a property aggregate query is resolved against the
// thing model handed in: a device of another product is refused on
// object, a property the model lacks or that is not numeric on its index
// as sent, and the model is handed back.
func TestAggResolve(t *testing.T) {
	model := `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}},{"id":"label","name":"Label","valueType":{"type":"string"}}],"events":[],"functions":[],"tags":[]}`
	f := func(q AggQuery, m AggModel, sent []string, field, msg string) {
		t.Helper()
		got, err := q.Resolve(m, sent)
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
	dev := AggQuery{ProductID: "p", DeviceID: "d", Properties: []string{"temp"}, Agg: AggAvg}
	f(dev, AggModel{ProductID: "p", Metadata: model}, nil, "", "")
	f(dev, AggModel{ProductID: "other", Metadata: model}, nil, "object", `device "d" belongs to product "other", not "p"`)
	prod := AggQuery{ProductID: "p", Properties: []string{"temp"}, Agg: AggMax}
	f(prod, AggModel{ProductID: "p", Metadata: model}, nil, "", "")
	f(AggQuery{ProductID: "p", Properties: []string{"temp", "nope"}}, AggModel{ProductID: "p", Metadata: model}, nil,
		"params.properties[1]", `property "nope" is not in the thing model of product "p"`)
	f(AggQuery{ProductID: "p", DeviceID: "d", Properties: []string{"label"}}, AggModel{ProductID: "p", Metadata: model}, nil,
		"params.properties[0]", `property "label" is of type string; aggregates need int, long, float or double`)
	// Repeats were dropped from Properties; errors name the index as sent.
	f(AggQuery{ProductID: "p", Properties: []string{"temp", "label"}}, AggModel{ProductID: "p", Metadata: model}, []string{"temp", "temp", "label"},
		"params.properties[2]", `property "label" is of type string`)
	// A model that does not parse counts as empty.
	f(prod, AggModel{ProductID: "p", Metadata: "{"}, nil, "params.properties[0]", `property "temp" is not in the thing model of product "p"`)
}

package tsdb

import "strings"

// The column types and codecs of device_property's layout (schema
// 00006), chosen here and nowhere else: the DDL names them as
// {{LAYOUT_*}} placeholders and statements() fills them in for the
// server's version, read at Open.
//
// ClickHouse 18.16, the release devicehub runs on here, has neither
// per-column codecs nor a LowCardinality type outside an experimental
// setting: it gets plain types, compressed by the server-wide method
// (.ci/clickhouse/config.xml: ZSTD level 1). Current releases get, per
// the CREATE TABLE codec documentation (clickhouse.com/docs, "Column
// compression codecs": CODEC(Delta, ZSTD(1)) pipelines):
//
//   - ts: CODEC(Delta, ZSTD(1)). The table is sorted by (product_id,
//     device_id, ts, property), so ts repeats once per property of a
//     report and then steps by the report interval: Delta turns the
//     repeats into runs of zeros and the steps into small numbers, which
//     ZSTD packs. DoubleDelta's bit packing is made for steady steps,
//     which the repeats break (a zero, then a step, then its negation).
//   - num_value: CODEC(ZSTD(1)), not Gorilla: in report order a value's
//     neighbour is another property of the same report (a temperature
//     beside a packet count), so Gorilla's XOR with the previous value
//     finds few equal bits, while ZSTD finds the same property's value of
//     the previous report a few rows back. T64 is for integers; the
//     column is Float64.
//   - str_value: CODEC(ZSTD(1)) (payload-like text and JSON).
//   - product_id and property: LowCardinality(String), few distinct
//     values per part. device_id stays String: a fleet has hundreds of
//     thousands of ids, past where LowCardinality's dictionary pays
//     (the documentation's guidance is under 10,000 distinct values), and
//     sorted second in the key it costs almost nothing already.
//
// Both forms hold the same values and answer the same SQL; only the
// bytes differ. The gate is the release in which all of these are
// generally available without experimental settings: 20.3, the long-term
// support release of 2020 (codecs came in 19.x releases, LowCardinality
// lost its experimental flag in 19.x too: the gate is set past both). No
// release newer than 18.16 runs on this machine, so the codec form is
// checked against the documentation and TestLayoutGate, not a server.

// layoutCodecsSince is the first release that gets the codec layout.
var layoutCodecsSince = Version{20, 3, 0}

// layoutFor returns the replacements of the {{LAYOUT_*}} placeholders
// for a server of version v.
func layoutFor(v Version) map[string]string {
	if !v.AtLeast(layoutCodecsSince) {
		return map[string]string{
			"{{LAYOUT_TIME_CODEC}}":  "",
			"{{LAYOUT_VALUE_CODEC}}": "",
			"{{LAYOUT_TEXT_CODEC}}":  "",
			"{{LAYOUT_ID_TYPE}}":     "String",
		}
	}
	return map[string]string{
		"{{LAYOUT_TIME_CODEC}}":  " CODEC(Delta, ZSTD(1))",
		"{{LAYOUT_VALUE_CODEC}}": " CODEC(ZSTD(1))",
		"{{LAYOUT_TEXT_CODEC}}":  " CODEC(ZSTD(1))",
		"{{LAYOUT_ID_TYPE}}":     "LowCardinality(String)",
	}
}

// layoutReplacer fills in the placeholders of layoutFor(v).
func layoutReplacer(v Version) *strings.Replacer {
	var pairs []string
	for k, r := range layoutFor(v) {
		pairs = append(pairs, k, r)
	}
	return strings.NewReplacer(pairs...)
}

// AtLeast reports whether v is w or newer.
func (v Version) AtLeast(w Version) bool {
	if v.Major != w.Major {
		return v.Major > w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor > w.Minor
	}
	return v.Patch >= w.Patch
}

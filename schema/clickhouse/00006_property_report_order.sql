-- Version 6: device_property stores each value's time once, as ts (epoch
-- milliseconds, Int64), and is sorted by (product_id, device_id, ts,
-- property): the values of one report lie next to each other, so ts
-- repeats once per property of the report and the block compressor keeps
-- it nearly for free, and each property's value follows its own value of
-- the previous report a few rows back (BENCHMARKS.md, Storage per value:
-- 6.3 B a value before, 1.8 B after, ZSTD 1 on ClickHouse 18.16). Every
-- query, view and the writer read and write ts only (18.16 shows no ALIAS
-- column to a materialized view, and does not narrow the primary key
-- through an expression of ts: tsdb filters on ts itself).
--
-- An existing database is converted at the first start of this version
-- (tsdb/convert.go): device_property_v6 is created beside the old table,
-- filled month by month (INSERT ... SELECT of one partition, recorded in
-- device_property_v6_copied once its rows are all there, so that an
-- interrupted conversion starts again at the month it was copying), then
-- the old views are dropped, the tables swapped by RENAME and the old one
-- dropped; the views below are created on the new table. Start the first
-- instance of this version with ingest paused, as for 00003.
--
-- {{LAYOUT_*}} are the column types and codecs the server supports
-- (tsdb/layout.go, the one place they are chosen): on 18.16 plain types
-- and the server-wide compression; on current releases codecs and
-- LowCardinality as well.
--@if SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'device_property' AND name = 'time'
CREATE TABLE IF NOT EXISTS device_property_v6 (
    ts         Int64{{LAYOUT_TIME_CODEC}},
    product_id {{LAYOUT_ID_TYPE}},
    device_id  String,
    property   {{LAYOUT_ID_TYPE}},
    value_type Enum8('number' = 1, 'string' = 2, 'bool' = 3, 'json' = 4),
    num_value  Float64{{LAYOUT_VALUE_CODEC}},
    str_value  String{{LAYOUT_TEXT_CODEC}}
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(toDateTime(intDiv(ts, 1000)))
ORDER BY (product_id, device_id, ts, property);

-- The months copied so far (tsdb/convert.go): a month is recorded once
-- device_property_v6 holds as many of its rows as device_property.
--@if SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'device_property' AND name = 'time'
CREATE TABLE IF NOT EXISTS device_property_v6_copied (
    partition String,
    copied    UInt64
) ENGINE = MergeTree()
ORDER BY partition;

--@convert device_property device_property_v6

-- The views of 00003 and 00005 on the new layout (their old forms, which
-- read time, are dropped by the conversion before the swap).
CREATE MATERIALIZED VIEW IF NOT EXISTS device_property_hourly_mv6 TO device_property_hourly AS
SELECT toDateTime(intDiv(ts, 3600000) * 3600) AS hour, product_id, device_id, property,
    countState() AS n, sumState(num_value) AS v_sum, minState(num_value) AS v_min, maxState(num_value) AS v_max,
    argMinState(num_value, (ts, num_value)) AS v_first, argMaxState(num_value, (ts, num_value)) AS v_last
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, device_id, property, hour;

CREATE MATERIALIZED VIEW IF NOT EXISTS device_property_product_hourly_mv6 TO device_property_product_hourly AS
SELECT toDateTime(intDiv(ts, 3600000) * 3600) AS hour, product_id, property,
    countState() AS n, sumState(num_value) AS v_sum, minState(num_value) AS v_min, maxState(num_value) AS v_max,
    minState(ts) AS t_first, argMinState(num_value, (ts, num_value)) AS v_first,
    maxState(ts) AS t_last, argMaxState(num_value, (ts, num_value)) AS v_last
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, property, hour;

CREATE MATERIALIZED VIEW IF NOT EXISTS device_property_daily_mv6 TO device_property_daily AS
SELECT toDate(toDateTime(intDiv(ts, 1000)), 'UTC') AS day, product_id, property, count() AS n
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, property, day;

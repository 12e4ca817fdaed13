-- Version 3: the hourly rollup of numeric property values. Per product,
-- device, property and hour, the count, sum, min, max, first and last of
-- the numeric values (value_type 'number'), as aggregate states that
-- merge into exactly what the same aggregate over device_property gives
-- (tsdb/rollup.go says when queries read it). Hours are UTC hours: a
-- value stored at epoch second s counts in the hour starting at
-- s - s % 3600, whatever the platform zone, so a change of zone needs no
-- rebuild; queries use the rollup only for buckets made of whole such
-- hours (every zone with whole-hour offsets).
CREATE TABLE IF NOT EXISTS device_property_hourly (
    hour       DateTime,
    product_id String,
    device_id  String,
    property   String,
    n          AggregateFunction(count),
    v_sum      AggregateFunction(sum, Float64),
    v_min      AggregateFunction(min, Float64),
    v_max      AggregateFunction(max, Float64),
    v_first    AggregateFunction(argMin, Float64, Tuple(Int64, Float64)),
    v_last     AggregateFunction(argMax, Float64, Tuple(Int64, Float64))
) ENGINE = AggregatingMergeTree()
PARTITION BY toYYYYMM(hour)
ORDER BY (product_id, device_id, property, hour);

-- Every insert into device_property from now on, rolled up as it is stored.
-- Only on the layout before version 6 (00006 replaces the view).
--@if SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'device_property' AND name = 'time'
CREATE MATERIALIZED VIEW IF NOT EXISTS device_property_hourly_mv TO device_property_hourly AS
SELECT toDateTime(intDiv(toUInt32(time), 3600) * 3600) AS hour, product_id, device_id, property,
    countState() AS n, sumState(num_value) AS v_sum, minState(num_value) AS v_min, maxState(num_value) AS v_max,
    argMinState(num_value, (ts, num_value)) AS v_first, argMaxState(num_value, (ts, num_value)) AS v_last
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, device_id, property, hour;

-- The values stored before the view existed (read through ts, which both
-- layouts have, as a fill may run again on the layout of 00006): once, at the first start
-- with this version, until device_property_hourly_filled exists (a start
-- interrupted before that does it again, from an empty rollup). It reads
-- the whole table in one INSERT ... SELECT, grouping with at most 1 GB of
-- memory before spilling to disk. A value another process stores between
-- the TRUNCATE and the start of the SELECT (milliseconds) is rolled up
-- twice: start the first instance of this version with ingest paused
-- (REFERENCE.md, Dashboard).
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_property_hourly_filled'
TRUNCATE TABLE device_property_hourly;
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_property_hourly_filled'
INSERT INTO device_property_hourly (hour, product_id, device_id, property, n, v_sum, v_min, v_max, v_first, v_last)
SELECT toDateTime(intDiv(ts, 3600000) * 3600) AS hour, product_id, device_id, property,
    countState() AS n, sumState(num_value) AS v_sum, minState(num_value) AS v_min, maxState(num_value) AS v_max,
    argMinState(num_value, (ts, num_value)) AS v_first, argMaxState(num_value, (ts, num_value)) AS v_last
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, device_id, property, hour
SETTINGS max_bytes_before_external_group_by = 1000000000;

-- The mark that the rollup holds every value: its existence (the catalog,
-- as for every other statement); it holds no rows.
CREATE TABLE IF NOT EXISTS device_property_hourly_filled (
    filled DateTime
) ENGINE = MergeTree()
ORDER BY filled;

-- Version 5: product-wide numeric property aggregates per UTC hour, and
-- value counts per UTC day, for the property aggregates kept in memory
-- (tsdb/propaggs.go). Per product, property and hour: count, sum, min and
-- max, and the first and last values with their times, ordered by (ts,
-- num_value) as every aggregate query orders them, so that a late value
-- can be merged into a kept hour exactly. Hours and days are UTC ones
-- (a value at epoch second s is in the hour s - s % 3600 and the day
-- s / 86400), whatever the platform zone: a change of zone needs no
-- rebuild.
CREATE TABLE IF NOT EXISTS device_property_product_hourly (
    hour       DateTime,
    product_id String,
    property   String,
    n          AggregateFunction(count),
    v_sum      AggregateFunction(sum, Float64),
    v_min      AggregateFunction(min, Float64),
    v_max      AggregateFunction(max, Float64),
    t_first    AggregateFunction(min, Int64),
    v_first    AggregateFunction(argMin, Float64, Tuple(Int64, Float64)),
    t_last     AggregateFunction(max, Int64),
    v_last     AggregateFunction(argMax, Float64, Tuple(Int64, Float64))
) ENGINE = AggregatingMergeTree()
PARTITION BY toYYYYMM(hour)
ORDER BY (product_id, property, hour);

-- The check of the hours (tsdb/daycounts.go's three reads): the numeric
-- values per product, property and UTC day, written by another view.
CREATE TABLE IF NOT EXISTS device_property_daily (
    day        Date,
    product_id String,
    property   String,
    n          UInt64
) ENGINE = SummingMergeTree()
PARTITION BY toYYYYMM(day)
ORDER BY (product_id, property, day);

-- Every insert into device_property from now on. An insert writes its
-- views one after the other in an order that differs between releases
-- and database engines: tsdb/daycounts.go keeps a month of hours only
-- when the daily table, read before and after them, counts the same
-- values per day.
-- Only on the layout before version 6 (00006 replaces the view).
--@if SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'device_property' AND name = 'time'
CREATE MATERIALIZED VIEW IF NOT EXISTS device_property_product_hourly_mv TO device_property_product_hourly AS
SELECT toDateTime(intDiv(toUInt32(time), 3600) * 3600) AS hour, product_id, property,
    countState() AS n, sumState(num_value) AS v_sum, minState(num_value) AS v_min, maxState(num_value) AS v_max,
    minState(ts) AS t_first, argMinState(num_value, (ts, num_value)) AS v_first,
    maxState(ts) AS t_last, argMaxState(num_value, (ts, num_value)) AS v_last
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, property, hour;

-- Only on the layout before version 6 (00006 replaces the view).
--@if SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'device_property' AND name = 'time'
CREATE MATERIALIZED VIEW IF NOT EXISTS device_property_daily_mv TO device_property_daily AS
SELECT toDate(time, 'UTC') AS day, product_id, property, count() AS n
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, property, day;

-- The values stored before the views existed (read through ts, which both
-- layouts have, as a fill may run again on the layout of 00006): once, as 00003 fills the
-- property rollup (the same caveat: start the first instance of this
-- version with ingest paused).
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_property_product_hourly_filled'
TRUNCATE TABLE device_property_product_hourly;
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_property_product_hourly_filled'
TRUNCATE TABLE device_property_daily;
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_property_product_hourly_filled'
INSERT INTO device_property_product_hourly (hour, product_id, property, n, v_sum, v_min, v_max, t_first, v_first, t_last, v_last)
SELECT toDateTime(intDiv(ts, 3600000) * 3600) AS hour, product_id, property,
    countState() AS n, sumState(num_value) AS v_sum, minState(num_value) AS v_min, maxState(num_value) AS v_max,
    minState(ts) AS t_first, argMinState(num_value, (ts, num_value)) AS v_first,
    maxState(ts) AS t_last, argMaxState(num_value, (ts, num_value)) AS v_last
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, property, hour
SETTINGS max_bytes_before_external_group_by = 1000000000;
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_property_product_hourly_filled'
INSERT INTO device_property_daily (day, product_id, property, n)
SELECT toDate(toDateTime(intDiv(ts, 1000)), 'UTC') AS day, product_id, property, count() AS n
FROM device_property
WHERE value_type = 'number'
GROUP BY product_id, property, day
SETTINGS max_bytes_before_external_group_by = 1000000000;

-- The mark that both tables hold every value: its existence.
CREATE TABLE IF NOT EXISTS device_property_product_hourly_filled (
    filled DateTime
) ENGINE = MergeTree()
ORDER BY filled;

-- Version 4: message counts per product and UTC quarter-hour, for the
-- message counts kept in memory (tsdb/daycounts.go): a quarter-hour
-- starting at epoch second s - s % 900 holds the messages stamped in it,
-- whatever the platform zone, so a change of zone needs no rebuild. Every
-- zone offset in use is a multiple of 15 minutes, so local 15m and 1h
-- buckets, days and months are unions of such quarter-hours.
CREATE TABLE IF NOT EXISTS device_message_quarter (
    slot       DateTime,
    product_id String,
    messages   UInt64
) ENGINE = SummingMergeTree()
PARTITION BY toYYYYMM(slot)
ORDER BY (product_id, slot);

-- Every insert into device_message from now on. ClickHouse 18.16 runs an
-- insert's views one after the other in the order of their names, so an
-- insert's rows reach device_message_daily (device_message_daily_mv)
-- before this table: tsdb/daycounts.go's exactness argument rests on it.
CREATE MATERIALIZED VIEW IF NOT EXISTS device_message_quarter_mv TO device_message_quarter AS
SELECT toDateTime(intDiv(toUInt32(time), 900) * 900) AS slot, product_id, count() AS messages
FROM device_message
GROUP BY product_id, slot;

-- The messages stored before the view existed: once, as 00003 fills the
-- property rollup (the same caveat: start the first instance of this
-- version with ingest paused).
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_message_quarter_filled'
TRUNCATE TABLE device_message_quarter;
--@if SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = 'device_message_quarter_filled'
INSERT INTO device_message_quarter (slot, product_id, messages)
SELECT toDateTime(intDiv(toUInt32(time), 900) * 900) AS slot, product_id, count() AS messages
FROM device_message
GROUP BY product_id, slot
SETTINGS max_bytes_before_external_group_by = 1000000000;

-- The mark that the table holds every message: its existence.
CREATE TABLE IF NOT EXISTS device_message_quarter_filled (
    filled DateTime
) ENGINE = MergeTree()
ORDER BY filled;

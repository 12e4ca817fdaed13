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

-- Every insert into device_message from now on. An insert writes its
-- views one after the other in an order that differs between releases
-- and database engines (names, table UUIDs), so this table and
-- device_message_daily may each be ahead of the other for a moment:
-- tsdb/daycounts.go keeps a month read from here only when the daily
-- table, read before and after it, counts the same messages per day.
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

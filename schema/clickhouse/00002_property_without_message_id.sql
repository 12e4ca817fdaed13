-- Version 2: device_property no longer keeps each value's message id.
-- Nothing read it but the id of a history item, which is now derived from
-- device, property and time; it was about a quarter of the table's bytes
-- before compression, and ClickHouse's inserts and merges paid for it on
-- every property value (BENCHMARKS.md). The message keeps its id in
-- device_message. ClickHouse 18.16 has no DROP COLUMN IF EXISTS, so the
-- statement carries its condition (see tsdb.ddl).
--@if SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'device_property' AND name = 'message_id'
ALTER TABLE device_property DROP COLUMN message_id;

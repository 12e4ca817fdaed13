-- Time-series tables. Statements are separated by ";" at line end and run in
-- order; {{TZ}} is replaced by the platform time zone (day boundaries of the
-- per-day counts). Valid on ClickHouse 18.16 and current releases: no CODEC,
-- TTL, DateTime64 or LowCardinality.

-- One row per uplink or downlink message.
CREATE TABLE IF NOT EXISTS device_message (
    time         DateTime,
    ts           Int64,
    product_id   String,
    device_id    String,
    direction    Enum8('up' = 1, 'down' = 2),
    message_type String,
    message_id   String,
    topic        String,
    payload      String
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (product_id, device_id, time);

-- One row per property value: numbers in num_value, everything else as text.
CREATE TABLE IF NOT EXISTS device_property (
    time       DateTime,
    ts         Int64,
    product_id String,
    device_id  String,
    property   String,
    value_type Enum8('number' = 1, 'string' = 2, 'bool' = 3, 'json' = 4),
    num_value  Float64,
    str_value  String,
    message_id String
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (product_id, device_id, property, time);

-- Per-day message counts, so 1d/1M aggregates read thousands of rows.
CREATE TABLE IF NOT EXISTS device_message_daily (
    day        Date,
    product_id String,
    messages   UInt64
) ENGINE = SummingMergeTree()
PARTITION BY toYYYYMM(day)
ORDER BY (product_id, day);

CREATE MATERIALIZED VIEW IF NOT EXISTS device_message_daily_mv TO device_message_daily AS
SELECT toDate(time, '{{TZ}}') AS day, product_id, count() AS messages
FROM device_message
GROUP BY day, product_id;

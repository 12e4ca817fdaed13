-- +goose Up
-- The evaluator's state in one row per device (ingest/alarm, Store.Write):
-- the device's part (the latest message applied, the keys of recent
-- messages, the latest values its rules read) and, under "r", the state
-- of each of its rules that holds something (how long a condition has
-- held, hits in a window, the timer's deadline, whether an alarm is
-- active), by rule id. A batch writes one row per device it touched,
-- where 00019's layout wrote the device's row and a row per changed
-- (rule, device): each row costs an index probe, a new row version and,
-- the first time its page is written after a checkpoint, a full-page
-- image in the WAL. On 100,000 devices with a no-data rule (a rule state
-- each), batches of 5,000 devices took 0.3-1.3 s (median 0.65 s) as two
-- upserts and 0.3-1.2 s (median 0.43 s) as one, ten batches each on
-- a machine shared with other work (load average 13-26).
-- JSON, not JSONB: the evaluator writes and reads the row whole, so
-- PostgreSQL need not build JSONB (460 bytes a row of the bench's ten
-- rules against 669). Fillfactor 70 leaves room on each page for the
-- next version of its rows: the key never changes, so an update is HOT
-- (no new index entry) where its page has room: all of those batches'
-- updates were, against 57-95% in the tables filled to 100%.
CREATE TABLE alarm_state (
    device_id  TEXT PRIMARY KEY,
    product_id TEXT NOT NULL,
    data       JSON NOT NULL
) WITH (fillfactor = 70);

-- Existing state moves over: each device's row with its rule states
-- folded in (a rule state without its device's row was never restored:
-- it is dropped).
INSERT INTO alarm_state (device_id, product_id, data)
SELECT d.device_id, d.product_id,
    (CASE WHEN r.states IS NULL THEN d.data ELSE d.data || jsonb_build_object('r', r.states) END)::json
FROM alarm_device_state d
LEFT JOIN (SELECT device_id, jsonb_object_agg(rule_id, data) AS states FROM alarm_rule_state GROUP BY device_id) r
    USING (device_id);

DROP TABLE alarm_rule_state;
DROP TABLE alarm_device_state;

-- +goose Down
CREATE TABLE alarm_device_state (
    device_id  TEXT PRIMARY KEY,
    product_id TEXT NOT NULL,
    data       JSONB NOT NULL
);
CREATE TABLE alarm_rule_state (
    device_id TEXT NOT NULL,
    rule_id   TEXT NOT NULL,
    data      JSONB NOT NULL,
    PRIMARY KEY (device_id, rule_id)
);
INSERT INTO alarm_device_state (device_id, product_id, data)
SELECT device_id, product_id, data::jsonb - 'r' FROM alarm_state;
INSERT INTO alarm_rule_state (device_id, rule_id, data)
SELECT s.device_id, r.key, r.value FROM alarm_state s, jsonb_each(s.data::jsonb -> 'r') AS r;
DROP TABLE alarm_state;

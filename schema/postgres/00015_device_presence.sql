-- +goose Up
-- Presence at fleet scale. ingest writes each device's online/offline
-- changes (state, online_time, offline_time, address) in batches; no index
-- holds those columns, so that the new row versions are HOT updates (on
-- the row's page, no index entry written) wherever the page has room,
-- which the fillfactor keeps for new pages. With an index on state, each
-- change wrote an entry in every index of devices (nine, two of them
-- trigram ones).
DROP INDEX devices_state;
ALTER TABLE devices SET (fillfactor = 85);

-- What the state index served instead: each product's devices online,
-- offline and notActive, kept with its device count (00007) in the
-- transaction that changes them, so that the device count and a list's
-- total for states and products (endpoint 7: the overview's "devices
-- online") are exact at any size without counting. Lists filter on state
-- through their order's index (createTime, name, a product's devices).
ALTER TABLE product_device_counts
    ADD COLUMN online     BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN offline    BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN not_active BIGINT NOT NULL DEFAULT 0;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION product_device_counts_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO product_device_counts AS c (product_id, devices, online, offline, not_active)
	SELECT product_id, count(*), count(*) FILTER (WHERE state = 'online'),
		count(*) FILTER (WHERE state = 'offline'), count(*) FILTER (WHERE state = 'notActive')
	FROM new_devices GROUP BY product_id ORDER BY product_id
	ON CONFLICT (product_id) DO UPDATE SET devices = c.devices + EXCLUDED.devices,
		online = c.online + EXCLUDED.online, offline = c.offline + EXCLUDED.offline,
		not_active = c.not_active + EXCLUDED.not_active;
	RETURN NULL;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION product_device_counts_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE product_device_counts c SET devices = c.devices - o.n,
		online = c.online - o.online, offline = c.offline - o.offline, not_active = c.not_active - o.not_active
	FROM (SELECT product_id, count(*) AS n, count(*) FILTER (WHERE state = 'online') AS online,
			count(*) FILTER (WHERE state = 'offline') AS offline, count(*) FILTER (WHERE state = 'notActive') AS not_active
		FROM old_devices GROUP BY product_id ORDER BY product_id) o
	WHERE c.product_id = o.product_id;
	RETURN NULL;
END
$$;
-- +goose StatementEnd
-- Every UPDATE of devices, once per statement: a batch of 500 presence
-- changes moves the counts of its few products once each (in product
-- order, as the others). It runs after the row-level trigger of a device
-- moved to another product, and counts the move too (its state leaves the
-- old product, arrives at the new).
-- +goose StatementBegin
CREATE FUNCTION product_device_counts_states() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO product_device_counts AS c (product_id, devices, online, offline, not_active)
	SELECT product_id, 0, sum(online), sum(offline), sum(not_active) FROM (
		SELECT product_id, (state = 'online')::int AS online, (state = 'offline')::int AS offline,
			(state = 'notActive')::int AS not_active FROM new_devices
		UNION ALL
		SELECT product_id, -(state = 'online')::int, -(state = 'offline')::int, -(state = 'notActive')::int
		FROM old_devices) d
	GROUP BY product_id HAVING sum(online) <> 0 OR sum(offline) <> 0 OR sum(not_active) <> 0
	ORDER BY product_id
	ON CONFLICT (product_id) DO UPDATE SET online = c.online + EXCLUDED.online,
		offline = c.offline + EXCLUDED.offline, not_active = c.not_active + EXCLUDED.not_active;
	RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER devices_count_states AFTER UPDATE ON devices
	REFERENCING OLD TABLE AS old_devices NEW TABLE AS new_devices
	FOR EACH STATEMENT EXECUTE FUNCTION product_device_counts_states();
-- The triggers exist (and lock out writers of devices) before the counts
-- are taken.
UPDATE product_device_counts c SET online = d.online, offline = d.offline, not_active = d.not_active
FROM (SELECT product_id, count(*) FILTER (WHERE state = 'online') AS online,
		count(*) FILTER (WHERE state = 'offline') AS offline, count(*) FILTER (WHERE state = 'notActive') AS not_active
	FROM devices GROUP BY product_id) d
WHERE c.product_id = d.product_id;

-- +goose Down
DROP TRIGGER devices_count_states ON devices;
DROP FUNCTION product_device_counts_states();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION product_device_counts_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO product_device_counts AS c (product_id, devices)
	SELECT product_id, count(*) FROM new_devices GROUP BY product_id ORDER BY product_id
	ON CONFLICT (product_id) DO UPDATE SET devices = c.devices + EXCLUDED.devices;
	RETURN NULL;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION product_device_counts_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE product_device_counts c SET devices = c.devices - o.n
	FROM (SELECT product_id, count(*) AS n FROM old_devices GROUP BY product_id ORDER BY product_id) o
	WHERE c.product_id = o.product_id;
	RETURN NULL;
END
$$;
-- +goose StatementEnd
ALTER TABLE product_device_counts DROP COLUMN not_active, DROP COLUMN offline, DROP COLUMN online;
ALTER TABLE devices RESET (fillfactor);
CREATE INDEX devices_state ON devices (state);

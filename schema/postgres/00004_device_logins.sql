-- +goose Up
-- A device's secureId is its MQTT username at the broker (README "Devices
-- over MQTT"): one per device. Devices without a login get one (secureId =
-- their id, a random key); of devices sharing a secureId, all but the
-- oldest get their id as secureId.
UPDATE devices SET secure_id = id WHERE secure_id = '';
UPDATE devices SET secure_key = replace(gen_random_uuid()::text, '-', '') WHERE secure_key = '';
UPDATE devices d SET secure_id = d.id
WHERE EXISTS (SELECT 1 FROM devices o WHERE o.secure_id = d.secure_id
	AND (o.create_time, o.id) < (d.create_time, d.id));
-- Rows written by hand may leave it empty: no login (see meta.DeviceLogin).
CREATE UNIQUE INDEX devices_secure_id ON devices (secure_id) WHERE secure_id <> '';

-- Every change of who may connect as a device is announced on channel
-- devicehub_device (payload: the device id), so that the broker's rules
-- follow within moments whoever changed the row (ingest/dynsec listens).
-- Presence updates (online/offline) do not fire it: WHEN filters them out
-- before any function runs.
-- +goose StatementBegin
CREATE FUNCTION devicehub_device_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'DELETE' THEN
		PERFORM pg_notify('devicehub_device', OLD.id);
		RETURN OLD;
	END IF;
	PERFORM pg_notify('devicehub_device', NEW.id);
	RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER devices_login_insert AFTER INSERT ON devices FOR EACH ROW
	WHEN (NEW.state <> 'notActive') EXECUTE FUNCTION devicehub_device_notify();
CREATE TRIGGER devices_login_update AFTER UPDATE ON devices FOR EACH ROW
	WHEN ((OLD.state = 'notActive') IS DISTINCT FROM (NEW.state = 'notActive')
		OR OLD.secure_id IS DISTINCT FROM NEW.secure_id
		OR OLD.secure_key IS DISTINCT FROM NEW.secure_key
		OR OLD.product_id IS DISTINCT FROM NEW.product_id)
	EXECUTE FUNCTION devicehub_device_notify();
CREATE TRIGGER devices_login_delete AFTER DELETE ON devices FOR EACH ROW
	WHEN (OLD.state <> 'notActive') EXECUTE FUNCTION devicehub_device_notify();

-- +goose Down
DROP TRIGGER devices_login_delete ON devices;
DROP TRIGGER devices_login_update ON devices;
DROP TRIGGER devices_login_insert ON devices;
DROP FUNCTION devicehub_device_notify();
DROP INDEX devices_secure_id;

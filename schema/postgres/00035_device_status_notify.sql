-- +goose Up
-- Channel devicehub_device (00004) also announces a device getting or
-- losing a thing model of its own: ingest's device cache re-reads the
-- devices announced (ingest/devices.go) instead of every device it holds
-- every 2 s, and whether a device has its own model is part of what it
-- reads (meta.DeviceStatus.OwnModel). The device-login sync re-reads such
-- a device's login and finds it unchanged. Presence updates still fire
-- nothing.
DROP TRIGGER devices_login_update ON devices;
CREATE TRIGGER devices_login_update AFTER UPDATE ON devices FOR EACH ROW
	WHEN ((OLD.state = 'notActive') IS DISTINCT FROM (NEW.state = 'notActive')
		OR OLD.secure_id IS DISTINCT FROM NEW.secure_id
		OR OLD.secure_key IS DISTINCT FROM NEW.secure_key
		OR OLD.product_id IS DISTINCT FROM NEW.product_id
		OR (OLD.metadata IS NULL) IS DISTINCT FROM (NEW.metadata IS NULL))
	EXECUTE FUNCTION devicehub_device_notify();

-- +goose Down
DROP TRIGGER devices_login_update ON devices;
CREATE TRIGGER devices_login_update AFTER UPDATE ON devices FOR EACH ROW
	WHEN ((OLD.state = 'notActive') IS DISTINCT FROM (NEW.state = 'notActive')
		OR OLD.secure_id IS DISTINCT FROM NEW.secure_id
		OR OLD.secure_key IS DISTINCT FROM NEW.secure_key
		OR OLD.product_id IS DISTINCT FROM NEW.product_id)
	EXECUTE FUNCTION devicehub_device_notify();

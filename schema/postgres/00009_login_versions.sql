-- +goose Up
-- Every change of what the broker must hold for a device (its login: the
-- WHEN condition of the devices_login_update trigger of 00004) gives the
-- row a new login_version from one sequence. A writer reads the version
-- its change made; the instance that feeds the broker's device logins
-- (ingest/devauth) announces each (device, version) it has applied on
-- channel devicehub_login_applied, so the writer answers once the broker
-- holds its change (or a later one).
CREATE SEQUENCE device_login_version;
ALTER TABLE devices ADD COLUMN login_version BIGINT NOT NULL DEFAULT nextval('device_login_version');
-- +goose StatementBegin
CREATE FUNCTION devicehub_device_login_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.login_version := nextval('device_login_version');
	RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER devices_login_version BEFORE UPDATE ON devices FOR EACH ROW
	WHEN ((OLD.state = 'notActive') IS DISTINCT FROM (NEW.state = 'notActive')
		OR OLD.secure_id IS DISTINCT FROM NEW.secure_id
		OR OLD.secure_key IS DISTINCT FROM NEW.secure_key
		OR OLD.product_id IS DISTINCT FROM NEW.product_id)
	EXECUTE FUNCTION devicehub_device_login_version();

-- +goose Down
DROP TRIGGER devices_login_version ON devices;
DROP FUNCTION devicehub_device_login_version();
ALTER TABLE devices DROP COLUMN login_version;
DROP SEQUENCE device_login_version;

-- +goose Up
-- Permissions (resource:action, meta/roles.go Permissions) granted by
-- roles; a user's permissions are the union of their enabled roles'
-- (user_roles, from 00001). Every role grants its permissions on every
-- product: a products column (the products a grant is limited to) can be
-- added to role_permissions later without changing this key.
CREATE TABLE role_permissions (
    role_id    TEXT NOT NULL REFERENCES roles (id) ON DELETE CASCADE,
    permission TEXT NOT NULL,
    PRIMARY KEY (role_id, permission)
);
CREATE INDEX user_roles_role_id ON user_roles (role_id);

-- The built-in roles. EnsureAdmin inserts admin too (ON CONFLICT DO
-- NOTHING), for databases where it ran first.
INSERT INTO roles (id, name, description, creator_id) VALUES
    ('admin', 'Administrator', 'Full access to the platform', 'admin'),
    ('operator', 'Operator', 'Reads, writes and commands devices; reads products and dashboards; no users, no device secrets', 'admin'),
    ('viewer', 'Viewer', 'Reads products, devices and dashboards', 'admin')
ON CONFLICT (id) DO NOTHING;
INSERT INTO role_permissions (role_id, permission)
SELECT r, p FROM (VALUES
    ('admin', 'product:read'), ('admin', 'product:write'), ('admin', 'device:read'), ('admin', 'device:write'),
    ('admin', 'device:command'), ('admin', 'device:secret'), ('admin', 'dashboard:read'), ('admin', 'user:admin'),
    ('operator', 'product:read'), ('operator', 'device:read'), ('operator', 'device:write'),
    ('operator', 'device:command'), ('operator', 'dashboard:read'),
    ('viewer', 'product:read'), ('viewer', 'device:read'), ('viewer', 'dashboard:read')
) AS g (r, p)
ON CONFLICT DO NOTHING;

-- Until now every account could do everything: one that holds no role
-- keeps that as an administrator, rather than losing all access.
INSERT INTO user_roles (user_id, role_id)
SELECT u.id, 'admin' FROM users u WHERE NOT EXISTS (SELECT 1 FROM user_roles ur WHERE ur.user_id = u.id);

-- A change of what a user may do is announced like the end of their
-- tokens (00010): every instance drops those tokens from its cache, and
-- the next request reads the user's permissions again; the tokens stay
-- valid. Live streams opened with them end (a browser reconnects, and is
-- checked again). Announced: the tokens of users whose roles change
-- (user_roles), of users holding a role whose permissions (role_permissions)
-- or state (roles) change.
-- +goose StatementBegin
CREATE FUNCTION devicehub_user_roles_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
			WHERE t.user_id IN (SELECT user_id FROM added) AND t.expires_at > now()));
	ELSIF TG_OP = 'DELETE' THEN
		PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
			WHERE t.user_id IN (SELECT user_id FROM gone) AND t.expires_at > now()));
	ELSE
		PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
			WHERE (t.user_id IN (SELECT user_id FROM added) OR t.user_id IN (SELECT user_id FROM gone)) AND t.expires_at > now()));
	END IF;
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION devicehub_role_grants_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
			JOIN user_roles ur ON ur.user_id = t.user_id
			WHERE ur.role_id IN (SELECT role_id FROM added) AND t.expires_at > now()));
	ELSIF TG_OP = 'DELETE' THEN
		PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
			JOIN user_roles ur ON ur.user_id = t.user_id
			WHERE ur.role_id IN (SELECT role_id FROM gone) AND t.expires_at > now()));
	ELSE
		PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
			JOIN user_roles ur ON ur.user_id = t.user_id
			WHERE (ur.role_id IN (SELECT role_id FROM added) OR ur.role_id IN (SELECT role_id FROM gone)) AND t.expires_at > now()));
	END IF;
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION devicehub_role_state_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
		JOIN user_roles ur ON ur.user_id = t.user_id
		WHERE ur.role_id = NEW.id AND t.expires_at > now()));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER user_roles_added AFTER INSERT ON user_roles REFERENCING NEW TABLE AS added
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_user_roles_changed();
CREATE TRIGGER user_roles_removed AFTER DELETE ON user_roles REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_user_roles_changed();
CREATE TRIGGER user_roles_updated AFTER UPDATE ON user_roles REFERENCING OLD TABLE AS gone NEW TABLE AS added
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_user_roles_changed();
CREATE TRIGGER role_permissions_added AFTER INSERT ON role_permissions REFERENCING NEW TABLE AS added
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_role_grants_changed();
CREATE TRIGGER role_permissions_removed AFTER DELETE ON role_permissions REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_role_grants_changed();
CREATE TRIGGER role_permissions_updated AFTER UPDATE ON role_permissions REFERENCING OLD TABLE AS gone NEW TABLE AS added
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_role_grants_changed();
CREATE TRIGGER roles_state_changed AFTER UPDATE OF state ON roles FOR EACH ROW
	WHEN (OLD.state IS DISTINCT FROM NEW.state)
	EXECUTE FUNCTION devicehub_role_state_changed();

-- +goose Down
DROP TRIGGER roles_state_changed ON roles;
DROP TRIGGER role_permissions_updated ON role_permissions;
DROP TRIGGER role_permissions_removed ON role_permissions;
DROP TRIGGER role_permissions_added ON role_permissions;
DROP TRIGGER user_roles_updated ON user_roles;
DROP TRIGGER user_roles_removed ON user_roles;
DROP TRIGGER user_roles_added ON user_roles;
DROP FUNCTION devicehub_role_state_changed();
DROP FUNCTION devicehub_role_grants_changed();
DROP FUNCTION devicehub_user_roles_changed();
DROP INDEX user_roles_role_id;
DROP TABLE role_permissions;

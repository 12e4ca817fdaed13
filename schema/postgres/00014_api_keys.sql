-- +goose Up
-- API keys (meta/keys.go): long-lived credentials a user makes for a
-- program. The secret is shown once; only its SHA-256 is kept (hash, as
-- tokens keep theirs). A key holds at most permissions, on at most
-- products (NULL: no product limit of its own), and never more than its
-- user holds at the time of each request (meta.User.Restrict): the user's
-- roles are read with the key. A key ends when it is deleted (revoked,
-- or its user deleted: the cascade), when it expires (expires_at; NULL:
-- never), and while its user is not enabled. last_used is written at most
-- once a minute per key.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    hash        BYTEA NOT NULL UNIQUE,
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    permissions TEXT[] NOT NULL,
    products    TEXT[],
    create_time TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ,
    last_used   TIMESTAMPTZ
);
CREATE INDEX api_keys_user_id ON api_keys (user_id, create_time DESC);

-- The audit trail (00013) names the key a request came with ('' for a
-- login's token).
ALTER TABLE audit ADD COLUMN key_id TEXT NOT NULL DEFAULT '';

-- A key's end, or a change of what it may do, is announced like a
-- token's (00010, 00011) on channel devicehub_tokens, by the hex of its
-- hash: every instance drops it from its token cache and ends the live
-- streams opened with it. devicehub_user_credentials gives the
-- announceable credentials of users: their unexpired tokens and keys.
-- +goose StatementBegin
CREATE FUNCTION devicehub_user_credentials(users text[]) RETURNS text[] LANGUAGE sql STABLE AS $$
	SELECT ARRAY(
		SELECT encode(t.hash, 'hex') FROM tokens t WHERE t.user_id = ANY(users) AND t.expires_at > now()
		UNION ALL
		SELECT encode(k.hash, 'hex') FROM api_keys k WHERE k.user_id = ANY(users) AND (k.expires_at IS NULL OR k.expires_at > now()))
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION devicehub_api_keys_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(hash, 'hex') FROM gone));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER api_keys_deleted AFTER DELETE ON api_keys REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_api_keys_deleted();
CREATE TRIGGER api_keys_truncated AFTER TRUNCATE ON api_keys
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_tokens_truncated();

-- The announcements of 00010 and 00011 (and 00012, which reuses them)
-- name the users' keys too: disabling a user, a change of its roles, of
-- their permissions, products or state.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION devicehub_user_disabled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY[NEW.id]));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION devicehub_user_roles_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY(SELECT user_id FROM added)));
	ELSIF TG_OP = 'DELETE' THEN
		PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY(SELECT user_id FROM gone)));
	ELSE
		PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY(SELECT user_id FROM added UNION SELECT user_id FROM gone)));
	END IF;
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION devicehub_role_grants_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY(SELECT ur.user_id FROM user_roles ur
			WHERE ur.role_id IN (SELECT role_id FROM added))));
	ELSIF TG_OP = 'DELETE' THEN
		PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY(SELECT ur.user_id FROM user_roles ur
			WHERE ur.role_id IN (SELECT role_id FROM gone))));
	ELSE
		PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY(SELECT ur.user_id FROM user_roles ur
			WHERE ur.role_id IN (SELECT role_id FROM added) OR ur.role_id IN (SELECT role_id FROM gone))));
	END IF;
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION devicehub_role_state_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(devicehub_user_credentials(ARRAY(SELECT ur.user_id FROM user_roles ur
		WHERE ur.role_id = NEW.id)));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The announcements of 00010 and 00011, naming tokens only.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION devicehub_user_disabled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(hash, 'hex') FROM tokens
		WHERE user_id = NEW.id AND expires_at > now()));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION devicehub_user_roles_changed() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE OR REPLACE FUNCTION devicehub_role_grants_changed() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE OR REPLACE FUNCTION devicehub_role_state_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(t.hash, 'hex') FROM tokens t
		JOIN user_roles ur ON ur.user_id = t.user_id
		WHERE ur.role_id = NEW.id AND t.expires_at > now()));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER api_keys_truncated ON api_keys;
DROP TRIGGER api_keys_deleted ON api_keys;
DROP FUNCTION devicehub_api_keys_deleted();
DROP FUNCTION devicehub_user_credentials(text[]);
ALTER TABLE audit DROP COLUMN key_id;
DROP TABLE api_keys;

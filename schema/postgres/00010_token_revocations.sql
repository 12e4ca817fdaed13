-- +goose Up
-- A token that ends before its expiry is announced on channel
-- devicehub_tokens as its transaction commits, whoever ended it (a
-- logout through any instance, psql): every devicehub instance drops it
-- from its token cache and ends the live streams opened with it
-- (meta/users.go WatchTokens). A token ends when its row is deleted
-- (logout; its user deleted, by the cascade) or its user stops being
-- enabled. The payload is the tokens' ids (the hex of their SHA-256, the
-- hash column), comma-separated, as many as fit a NOTIFY (8,000 bytes);
-- more take more announcements. Tokens already expired are not announced:
-- whoever checks one finds it expired. A TRUNCATE announces '*': every
-- token may have ended.
-- +goose StatementBegin
CREATE FUNCTION devicehub_tokens_announce(ids text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	batch text := '';
	id text;
BEGIN
	FOREACH id IN ARRAY ids LOOP
		IF length(batch) + length(id) >= 7900 THEN
			PERFORM pg_notify('devicehub_tokens', batch);
			batch := '';
		END IF;
		batch := CASE WHEN batch = '' THEN id ELSE batch || ',' || id END;
	END LOOP;
	IF batch <> '' THEN
		PERFORM pg_notify('devicehub_tokens', batch);
	END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION devicehub_tokens_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(hash, 'hex') FROM gone WHERE expires_at > now()));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION devicehub_tokens_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('devicehub_tokens', '*');
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION devicehub_user_disabled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM devicehub_tokens_announce(ARRAY(SELECT encode(hash, 'hex') FROM tokens
		WHERE user_id = NEW.id AND expires_at > now()));
	RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Statement-level, with the deleted rows: a logout is one announcement,
-- and so is a sweep of many rows (mostly expired ones, not announced).
CREATE TRIGGER tokens_deleted AFTER DELETE ON tokens REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_tokens_deleted();
CREATE TRIGGER tokens_truncated AFTER TRUNCATE ON tokens
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_tokens_truncated();
CREATE TRIGGER users_disabled AFTER UPDATE OF state ON users FOR EACH ROW
	WHEN (OLD.state = 'enabled' AND NEW.state IS DISTINCT FROM 'enabled')
	EXECUTE FUNCTION devicehub_user_disabled();

-- +goose Down
DROP TRIGGER users_disabled ON users;
DROP TRIGGER tokens_truncated ON tokens;
DROP TRIGGER tokens_deleted ON tokens;
DROP FUNCTION devicehub_user_disabled();
DROP FUNCTION devicehub_tokens_truncated();
DROP FUNCTION devicehub_tokens_deleted();
DROP FUNCTION devicehub_tokens_announce(text[]);

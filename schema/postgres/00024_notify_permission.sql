-- +goose Up
-- notify:admin (ingest/notify's channels, subscriptions and dead letters)
-- is granted by the built-in admin role, as every permission is.
INSERT INTO role_permissions (role_id, permission) VALUES ('admin', 'notify:admin') ON CONFLICT DO NOTHING;

-- +goose Down
DELETE FROM role_permissions WHERE permission = 'notify:admin';

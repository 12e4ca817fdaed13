-- +goose Up
-- Keeps the device list (endpoint 7) fast at 100k+ devices. The query
-- engine turns termType like into ILIKE '%...%', which a btree cannot serve;
-- trigram GIN indexes can. pg_trgm is a trusted extension (PostgreSQL 13+),
-- so the database owner may create it; it ships with the server on Debian.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX devices_name_trgm ON devices USING gin (name gin_trgm_ops);
CREATE INDEX devices_id_trgm ON devices USING gin (id gin_trgm_ops);
CREATE INDEX products_name_trgm ON products USING gin (name gin_trgm_ops);
-- A product's devices, newest first: the list filtered on productId, the
-- products' deviceNum count (index-only) and the foreign-key check on
-- product delete. It makes the single-column index redundant.
CREATE INDEX devices_product_create_time ON devices (product_id, create_time DESC, id);
DROP INDEX devices_product_id;
-- devices_state (00001) serves the state filter and the ingest's state sweeps.

-- +goose Down
CREATE INDEX devices_product_id ON devices (product_id);
DROP INDEX devices_product_create_time;
DROP INDEX products_name_trgm;
DROP INDEX devices_id_trgm;
DROP INDEX devices_name_trgm;
-- pg_trgm stays: dropping an extension others may use is not this
-- migration's business.

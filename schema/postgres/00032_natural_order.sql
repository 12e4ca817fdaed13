-- +goose Up
-- The order of the lists' id and name sorts (meta.Natural): natural and
-- case-insensitive, as people read ids ("dev-1, dev-2, Dev-3, dev-10"),
-- through an ICU collation with numeric ordering (kn) at secondary
-- strength (ks-level2: case ignored, accents not). It is deterministic, so
-- strings it finds equal ("Dev-3", "dev-3") are ordered by their bytes:
-- distinct ids never tie, and pages of an id order neither repeat nor skip
-- a row.
--
-- A PostgreSQL built without ICU cannot create it: the collation is then
-- a libc one of the database's own collation, so the lists keep the order
-- they had before (ids as text, d10 before d2) and the migration succeeds.
-- +goose StatementBegin
DO $$
BEGIN
    CREATE COLLATION IF NOT EXISTS devicehub_natural (provider = icu, locale = 'und-u-kn-true-ks-level2');
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'devicehub_natural: no ICU (%), lists sort ids in the database''s collation', SQLERRM;
    EXECUTE format('CREATE COLLATION IF NOT EXISTS devicehub_natural (provider = libc, locale = %L)',
        (SELECT datcollate FROM pg_database WHERE datname = current_database()));
END
$$;
-- +goose StatementEnd

-- The indexes of these orders, so that a page of a large list reads its
-- rows in order instead of sorting the whole match: devices by id (and a
-- product's devices by id, the console's list) and by name, products by
-- id and by name. The name indexes end with the id, the sorts' tie-break.
CREATE INDEX devices_id_natural ON devices (id COLLATE devicehub_natural);
CREATE INDEX devices_product_id_natural ON devices (product_id, id COLLATE devicehub_natural);
CREATE INDEX devices_name_natural ON devices (name COLLATE devicehub_natural, id COLLATE devicehub_natural);
CREATE INDEX products_id_natural ON products (id COLLATE devicehub_natural);
CREATE INDEX products_name_natural ON products (name COLLATE devicehub_natural, id COLLATE devicehub_natural);

-- +goose Down
DROP INDEX products_name_natural;
DROP INDEX products_id_natural;
DROP INDEX devices_name_natural;
DROP INDEX devices_product_id_natural;
DROP INDEX devices_id_natural;
DROP COLLATION devicehub_natural;

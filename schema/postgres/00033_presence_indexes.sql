-- +goose Up
-- A presence change (ingest's batched online/offline writes) sets no
-- indexed column (00015), so it is a HOT update where its page has room;
-- where it has none (a page filled by concurrent writers faster than it
-- is pruned, or packed before 00015) the new row version gets an entry
-- in every index of devices. Each index no query reads is paid there.
--
-- devices_name (name, id), 00007's index of the name sort and of eq on
-- name, is one: the name sort reads devices_name_natural (00032) since
-- the sort is natural, and eq and in on name are planned on the GiST
-- trigram index (pg_trgm's equality) with or without it (EXPLAIN of
-- 44 device list shapes, scoped and not, on 100,000 devices). Every
-- other index of devices is the only one
-- of some list's plan: the default order (devices_create_time), a
-- product's devices by time (devices_product_create_time: 0.04 ms against
-- 0.5-1.4 ms for a product of 200-2,000 devices without it), by id and
-- name (the natural ones), like on id and name (the trigram ones), the
-- primary key and the secure ids' uniqueness.
DROP INDEX devices_name;

-- +goose Down
CREATE INDEX devices_name ON devices (name, id);

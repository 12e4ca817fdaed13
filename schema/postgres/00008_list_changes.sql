-- +goose Up
-- Every statement that changes a table the product and device lists read
-- announces the table's name on channel devicehub_lists as its
-- transaction commits, whoever wrote it: each devicehub instance keeps
-- pages of those lists until an announcement says they may have changed
-- (meta/pagecache.go). Statement-level: a bulk write is one announcement,
-- and PostgreSQL folds identical ones of one transaction into one.
-- +goose StatementBegin
CREATE FUNCTION devicehub_list_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('devicehub_lists', TG_TABLE_NAME);
	RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER products_list_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON products
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_list_notify();
CREATE TRIGGER devices_list_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON devices
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_list_notify();
CREATE TRIGGER product_device_counts_list_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON product_device_counts
	FOR EACH STATEMENT EXECUTE FUNCTION devicehub_list_notify();

-- +goose Down
DROP TRIGGER product_device_counts_list_change ON product_device_counts;
DROP TRIGGER devices_list_change ON devices;
DROP TRIGGER products_list_change ON products;
DROP FUNCTION devicehub_list_notify();

-- +goose Up
-- What a product's shadows do with a desired property once the device
-- reports its value (ingest/shadow): keep it as the target (the default,
-- no row) or, with clear_reached, take it out of desired (a change of
-- desired: the version grows). Deleting the product deletes its row.
CREATE TABLE product_shadow_settings (
    product_id    TEXT PRIMARY KEY REFERENCES products (id) ON DELETE CASCADE,
    clear_reached BOOLEAN NOT NULL
);

-- +goose Down
DROP TABLE product_shadow_settings;

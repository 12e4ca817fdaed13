package main

import (
	"devicehub/ingest/shadow"
	"devicehub/meta"
	"devicehub/tsdb"
)

// newShadows builds the devices' shadows (ingest/shadow). Ingest hands it
// births from its start on; it sends on send, the command path built
// after ingest (lateCommands). changed is told each committed change
// (the live relay).
func newShadows(store *meta.Store, ts *tsdb.DB, cfg config, send *lateCommands, changed func(string, shadow.View)) *shadow.Service {
	opt := shadow.DefaultOptions()
	opt.Changed = changed
	return shadow.New(shadow.NewStore(store, cfg.QueryTimeout), ts, send, opt)
}

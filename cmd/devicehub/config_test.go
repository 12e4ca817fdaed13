package main

import (
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	f := func(env map[string]string, args []string, check func(c config) bool, wantErr string) {
		t.Helper()
		c, err := loadConfig(args, func(k string) string { return env[k] })
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Errorf("env %v args %v: err %v, want %q", env, args, err, wantErr)
			}
			return
		}
		if err != nil {
			t.Errorf("env %v args %v: %v", env, args, err)
			return
		}
		if !check(c) {
			t.Errorf("env %v args %v: config %+v", env, args, c)
		}
	}
	f(nil, nil, func(c config) bool {
		return c.HTTPAddr == "127.0.0.1:8848" && c.BatchRows == 300000 && c.BatchBytes == 32<<20 && c.FlushInterval == time.Second && c.IngestWriters == 0 &&
			c.RetentionMonths == 0 && c.PprofAddr == "" && c.MemoryLimit == 160<<20 && c.Roles["api"] && c.Roles["ingest"]
	}, "")
	f(map[string]string{"DEVICEHUB_INGEST_BATCH_ROWS": "50000", "DEVICEHUB_INGEST_FLUSH_INTERVAL": "1s", "DEVICEHUB_RETENTION_MONTHS": "12"}, nil,
		func(c config) bool {
			return c.BatchRows == 50000 && c.FlushInterval == time.Second && c.RetentionMonths == 12
		}, "")
	// Flags override the environment.
	f(map[string]string{"DEVICEHUB_INGEST_BATCH_ROWS": "50000", "DEVICEHUB_INGEST_CONNECTIONS": "3"}, []string{"-ingest-batch-rows=7", "-roles=ingest"},
		func(c config) bool {
			return c.BatchRows == 7 && c.IngestConnections == 3 && !c.Roles["api"] && c.Roles["ingest"]
		}, "")
	f(nil, []string{"-ingest-batch-rows=-1"}, nil, "must be positive")
	f(nil, []string{"-ingest-flush-interval=0s"}, nil, "must be positive")
	f(nil, []string{"-ingest-batch-rows=1000001"}, nil, "at most 1000000")
	f(map[string]string{"DEVICEHUB_INGEST_BATCH_BYTES": "128MiB"}, nil, func(c config) bool { return c.BatchBytes == 128<<20 }, "")
	f(nil, []string{"-ingest-batch-bytes=0"}, nil, "must be 1 to")
	f(nil, []string{"-ingest-batch-bytes=2GiB"}, nil, "must be 1 to")
	f(nil, []string{"-ingest-batch-bytes=big"}, nil, `"big" is not a size`)
	f(map[string]string{"DEVICEHUB_INGEST_WRITERS": "3"}, nil, func(c config) bool { return c.IngestWriters == 3 }, "")
	f(nil, []string{"-ingest-writers=-1"}, nil, "must be 0 (the default) or more")
	f(nil, []string{"-retention-months=-2"}, nil, "retention-months")
	f(map[string]string{"DEVICEHUB_MEMORY_LIMIT": "1GiB"}, nil, func(c config) bool { return c.MemoryLimit == 1<<30 }, "")
	f(nil, []string{"-memory-limit=0"}, func(c config) bool { return c.MemoryLimit == 0 }, "")
	f(nil, []string{"-memory-limit=5000"}, func(c config) bool { return c.MemoryLimit == 5000 }, "")
	f(nil, []string{"-memory-limit=lots"}, nil, `"lots" is not a size`)
	f(nil, []string{"-memory-limit=-1MiB"}, nil, "not a size")
	f(nil, []string{"-memory-limit=99999999999GiB"}, nil, "not a size")
	f(nil, []string{"-roles=web"}, nil, "unknown role")
	f(nil, []string{"-roles=,"}, nil, "no role")
}

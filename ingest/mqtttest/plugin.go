package mqtttest

import (
	"os"
	"path/filepath"
	"strings"
)

// AuthOption sets plugin_opt_<name> of devicehub's auth plugin
// (ingest/devauth/mosquitto) in the broker's configuration, replacing the
// line .ci/mosquitto-setup wrote or adding one after the plugin's line; it
// applies from the next Start.
func (b *Broker) AuthOption(name, value string) {
	b.t.Helper()
	path := filepath.Join(b.dir, "mosquitto.conf")
	src, err := os.ReadFile(path)
	if err != nil {
		b.t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	at := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "plugin ") && strings.HasSuffix(l, "/devicehub_auth.so") {
			at = i
			break
		}
	}
	if at < 0 {
		b.t.Fatal("mqtttest: devicehub's auth plugin is not in the broker's configuration")
	}
	opt := "plugin_opt_" + name + " " + value
	i := at + 1
	for ; i < len(lines) && strings.HasPrefix(lines[i], "plugin_opt_"); i++ {
		if strings.HasPrefix(lines[i], "plugin_opt_"+name+" ") {
			lines[i] = opt
			break
		}
	}
	if i == len(lines) || lines[i] != opt {
		lines = append(lines[:i], append([]string{opt}, lines[i:]...)...)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// AuthSnapshot is the path of the auth plugin's snapshot file.
func (b *Broker) AuthSnapshot() string { return filepath.Join(b.dir, "devicehub-auth.snapshot") }

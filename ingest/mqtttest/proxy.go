package mqtttest

import (
	"net/url"
	"testing"

	"devicehub/meta/metatest"
)

// Proxy is a TCP proxy to the broker at brokerURL (tcp://host:port) that
// decides each connection's fate (metatest.Fate): a broker that stays
// silent, hangs up or answers, for the tests of connecting.
func Proxy(t testing.TB, brokerURL string, fate func(n int) metatest.Fate) *metatest.Proxy {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	return metatest.NewProxyWith(t, u.Host, fate)
}

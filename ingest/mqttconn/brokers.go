package mqttconn

import (
	"fmt"
	"net/url"
	"strings"
)

// Brokers splits a broker setting, one URL or several separated by commas
// (a broker pool, each broker holding a share of the devices), into its
// URLs. An empty element, a URL without a host or the same URL twice is an
// error. Every component that talks to the brokers (the ingest pipeline,
// Presence, the devauth syncer) takes the same setting and connects to
// each URL in this order; index i is broker i everywhere.
func Brokers(setting string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, raw := range strings.Split(setting, ",") {
		u := strings.TrimSpace(raw)
		if u == "" {
			return nil, fmt.Errorf("broker list %q has an empty element", setting)
		}
		p, err := url.Parse(u)
		if err != nil || p.Host == "" {
			return nil, fmt.Errorf("broker %q is not a URL like tcp://host:1883", BrokerName(u))
		}
		if seen[u] {
			return nil, fmt.Errorf("broker %q is listed twice", BrokerName(u))
		}
		seen[u] = true
		out = append(out, u)
	}
	return out, nil
}

// MustBrokers is Brokers for a setting already checked (the defaults, a
// validated configuration): an invalid one gives the setting as one URL,
// which fails to connect with paho's own error.
func MustBrokers(setting string) []string {
	bs, err := Brokers(setting)
	if err != nil {
		return []string{setting}
	}
	return bs
}

// BrokerName names a broker in logs and readiness checks: its host and
// port, without the scheme or a login.
func BrokerName(brokerURL string) string {
	if p, err := url.Parse(brokerURL); err == nil && p.Host != "" {
		return p.Host
	}
	return "broker"
}

package bench

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"time"

	"devicehub/ingest/dynsec"
	"devicehub/ingest/link"
)

// serviceLogin is devicehub's own broker login: the bench reads the
// broker's $SYS counters and removes ingest sessions with it, as the
// server under test uses it ($DEVICEHUB_MQTT_USERNAME and _PASSWORD, or
// link.DefaultLogin).
func serviceLogin() link.Login {
	l := link.DefaultLogin
	if u := os.Getenv("DEVICEHUB_MQTT_USERNAME"); u != "" {
		l.Username = u
	}
	if pw := os.Getenv("DEVICEHUB_MQTT_PASSWORD"); pw != "" {
		l.Password = pw
	}
	return l
}

// newGateway creates a broker login that may publish on every device's
// topics (dynsec.GatewayRole): the ingest generator plays a thousand
// devices on a few connections. remove deletes it.
func newGateway(ctx context.Context, broker string) (login link.Login, remove func(), err error) {
	admin, err := dialAdmin(ctx, broker)
	if err != nil {
		return login, nil, err
	}
	defer admin.Close()
	login = link.Login{Username: "bench-gw-" + strings.ToLower(rand.Text()[:8]), Password: rand.Text()}
	if err := dynsec.AddGateway(ctx, admin, login.Username, login.Password); err != nil {
		return login, nil, err
	}
	return login, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if admin, err := dialAdmin(ctx, broker); err == nil {
			_ = dynsec.RemoveLogin(ctx, admin, login.Username)
			admin.Close()
		}
	}, nil
}

func dialAdmin(ctx context.Context, broker string) (*dynsec.Client, error) {
	return dynsec.Dial(ctx, serviceLogin().NewClientOptions(broker, "bench-admin-"+randHex(4)), nil)
}

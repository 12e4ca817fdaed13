package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/bench/fwdevice"
	"devicehub/bench/mqttc"
)

// fwFleet is the firmware bench's simulated devices: a bench/fwdevice
// updater each, played over a few gateway connections of bench/mqttc (the
// first one subscribed to every device's firmware/upgrade, which it hands
// to the device's updater), downloading with one HTTP client of this
// process. A device's reboot is an offline and a birth message, then its
// version report.
type fwFleet struct {
	product string
	ids     []string
	devs    []*fwdevice.Updater
	gws     []*mqttc.Client
	client  *http.Client

	mu       sync.Mutex
	handlers map[string]func([]byte) // by upgrade topic

	track atomic.Pointer[fwTrack] // the running phase's
	// reports counts the firmware reports (progress and version) the
	// broker acknowledged: what devicehub is to store.
	reports atomic.Int64
}

// fwLogin is a device's login: its HTTP Basic auth for downloads.
type fwLogin struct{ ID, SecureID, SecureKey string }

// fwTrack follows one phase from the devices' reports.
type fwTrack struct {
	target string
	n      int
	start  time.Time

	mu              sync.Mutex
	firstDownload   time.Time // first DOWNLOADING
	lastDownloaded  time.Time // last DOWNLOADED
	lastUpdated     time.Time
	updated         map[string]bool
	failed, reports int
	reasons         map[string]int
}

func newFWTrack(target string, n int) *fwTrack {
	return &fwTrack{target: target, n: n, start: time.Now(), updated: make(map[string]bool, n), reasons: map[string]int{}}
}

func (t *fwTrack) see(id string, p fwdevice.Progress) {
	if p.Version != t.target || p.State == "" {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reports++
	switch p.State {
	case fwdevice.Downloading:
		if t.firstDownload.IsZero() {
			t.firstDownload = now
		}
	case fwdevice.Downloaded:
		t.lastDownloaded = now
	case fwdevice.Updated:
		if !t.updated[id] {
			t.updated[id] = true
			t.lastUpdated = now
		}
	case fwdevice.Failed:
		t.failed++
		if len(t.reasons) < 20 {
			t.reasons[p.Reason]++
		}
	}
}

func (t *fwTrack) counts() (updated, failed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.updated), t.failed
}

// startFWFleet connects gateways gateway connections to broker (host:port)
// with a gateway login it creates there, makes an updater per login on
// version, and brings each device up: birth, subscription, version report.
func startFWFleet(ctx context.Context, brokerURL, product string, logins []fwLogin, version string, gateways int) (_ *fwFleet, err error) {
	f := &fwFleet{product: product, handlers: make(map[string]func([]byte), len(logins)),
		client: &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 256, IdleConnTimeout: 5 * time.Second, DisableCompression: true,
		}}}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	// The private broker goes with its logins: no removal.
	gateway, _, err := newGateway(ctx, brokerURL)
	if err != nil {
		return nil, err
	}
	addr := brokerURL[len("tcp://"):]
	for i := range max(gateways, 1) {
		opt := mqttc.Options{Addr: addr, MaxPacket: 1 << 20,
			Connect: mqttc.Connect{ClientID: "bench-fw-" + randHex(4), Username: gateway.Username, Password: gateway.Password, KeepAlive: 60, CleanSession: true}}
		if i == 0 {
			opt.OnMessage = f.dispatch
		}
		c, err := mqttc.Dial(ctx, opt)
		if err != nil {
			return nil, fmt.Errorf("bench: firmware gateway: %w", err)
		}
		f.gws = append(f.gws, c)
	}
	if g, err := f.gws[0].Subscribe(ctx, "/"+product+"/+/"+fwdevice.LevelUpgrade, 1); err != nil || g > 1 {
		return nil, fmt.Errorf("bench: firmware gateway subscribe: granted %d, %v", g, err)
	}
	for i, l := range logins {
		conn := &fwGatewayConn{f: f, c: f.gws[i%len(f.gws)]}
		id := l.ID
		u, err := fwdevice.New(fwdevice.Options{ProductID: product, DeviceID: id, Version: version,
			SecureID: l.SecureID, SecureKey: l.SecureKey, HTTPClient: f.client, Timeout: 10 * time.Minute,
			Reboot: func(context.Context) error { return conn.reboot(id) },
			OnReport: func(p fwdevice.Progress) {
				if t := f.track.Load(); t != nil {
					t.see(id, p)
				}
			}})
		if err != nil {
			return nil, err
		}
		conn.u = u
		f.ids = append(f.ids, id)
		f.devs = append(f.devs, u)
	}
	// Every device up: birth, then subscription and version report.
	err = forEach(ctx, len(f.devs), 256, func(_ context.Context, i int) error {
		conn := &fwGatewayConn{f: f, c: f.gws[i%len(f.gws)], u: f.devs[i]}
		if err := conn.Publish(f.topic(f.ids[i], "online"), []byte(`{}`)); err != nil {
			return err
		}
		return f.devs[i].Connected(conn)
	})
	if err != nil {
		return nil, fmt.Errorf("bench: firmware devices up: %w", err)
	}
	return f, nil
}

func (f *fwFleet) topic(id, level string) string { return "/" + f.product + "/" + id + "/" + level }

// dispatch hands an upgrade to its device's updater (the first gateway's
// reader goroutine; the updater does not block).
func (f *fwFleet) dispatch(p mqttc.Packet) {
	f.mu.Lock()
	h := f.handlers[p.Topic]
	f.mu.Unlock()
	if h != nil {
		h(p.Payload)
	}
}

// upgradeAll publishes an upgrade to every device, as a rollout of this
// process would (the ceiling phase), through the first gateway.
func (f *fwFleet) upgradeAll(ctx context.Context, up fwdevice.Upgrade) error {
	return forEach(ctx, len(f.ids), 64, func(_ context.Context, i int) error {
		u := up
		u.MessageID = randHex(8)
		u.Timestamp = time.Now().UnixMilli()
		b, _ := json.Marshal(u)
		conn := &fwGatewayConn{f: f, c: f.gws[0]}
		return conn.Publish(f.topic(f.ids[i], fwdevice.LevelUpgrade), b)
	})
}

// bytes is what every device downloaded so far, how many downloads they
// resumed and how many 5xx answers they had (retried).
func (f *fwFleet) bytes() (n, resumes, serverErrors int64) {
	for _, u := range f.devs {
		n += u.Downloaded.Load()
		resumes += u.Resumes.Load()
		serverErrors += u.ServerErrors.Load()
	}
	return n, resumes, serverErrors
}

func (f *fwFleet) close() {
	for _, u := range f.devs {
		u.Close()
	}
	for _, c := range f.gws {
		_ = c.Disconnect()
	}
	if t, ok := f.client.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// fwGatewayConn is one device's fwdevice.Conn over a gateway connection.
type fwGatewayConn struct {
	f *fwFleet
	c *mqttc.Client
	u *fwdevice.Updater
}

// Publish sends at QoS 1 and waits for the PUBACK.
func (g *fwGatewayConn) Publish(topic string, payload []byte) error {
	acked := make(chan error, 1)
	if err := g.c.Publish(topic, payload, 1, false, func(err error) { acked <- err }); err != nil {
		return err
	}
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case err := <-acked:
		if err == nil && (strings.HasSuffix(topic, "/"+fwdevice.LevelProgress) || strings.HasSuffix(topic, "/"+fwdevice.LevelVersion)) {
			g.f.reports.Add(1)
		}
		return err
	case <-t.C:
		return errors.New("bench: no PUBACK within a minute")
	}
}

// Subscribe registers the device's handler; the first gateway is
// subscribed to every device's upgrade topic.
func (g *fwGatewayConn) Subscribe(topic string, handler func([]byte)) error {
	g.f.mu.Lock()
	g.f.handlers[topic] = handler
	g.f.mu.Unlock()
	return nil
}

// reboot is the device's: offline, birth, version report.
func (g *fwGatewayConn) reboot(id string) error {
	if err := g.Publish(g.f.topic(id, "offline"), []byte(`{"reason":"reboot"}`)); err != nil {
		return err
	}
	if err := g.Publish(g.f.topic(id, "online"), []byte(`{}`)); err != nil {
		return err
	}
	return g.u.Connected(g)
}

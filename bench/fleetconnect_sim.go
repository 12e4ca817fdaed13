package bench

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/bench/mqttc"
	"devicehub/schema/backoff"
)

// connectFleet is the simulated fleet of fleet-connect: one lean MQTT
// connection per device (bench/mqttc), each with its own login, client id
// and last will, spread over several loopback source addresses; a birth
// on every connect; a QoS 1 report every interval at the device's own
// phase; jittered exponential backoff after a lost connection, as device
// SDKs do. It keeps what the broker acknowledged, so that the end of the
// run can tell what was stored from what was lost.
type connectFleet struct {
	addr                   string // broker host:port
	product                string
	logins                 []fleetLogin
	interval               time.Duration
	sources                []net.IP
	backoffMin, backoffMax time.Duration
	keepAlive              uint16

	devs     []*simDev
	connectQ chan int
	closing  atomic.Bool
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	connected    atomic.Int64 // connections up now
	connects     atomic.Int64 // successful connects
	dialFailures atomic.Int64
	refused      atomic.Int64 // CONNACK refusals among them
	lost         atomic.Int64 // connections lost (not closed by us)
	sent         atomic.Int64 // reports published
	acked        atomic.Int64 // reports acknowledged
	ackFailed    atomic.Int64 // reports whose connection went before the PUBACK
	skipped      atomic.Int64 // reports not sent: not connected, or 4 unacknowledged
	birthsAcked  atomic.Int64
	connack      atomic.Pointer[Histogram] // dial to CONNACK of successful connects, this storm
}

// simDev is one simulated device.
type simDev struct {
	idx     int
	mu      sync.Mutex
	c       *mqttc.Client
	connNo  uint32 // connects so far (the birth's and the will's id)
	attempt int    // failed dials since the last connect
	seq     uint32 // reports published so far
	acked   []uint32
	births  []uint32 // connNo of each acknowledged birth
}

// loopbackSources are n source addresses 127.0.0.2, 127.0.0.3, ...: each
// has its own range of ephemeral ports (about 28,000), which one address
// alone runs out of.
func loopbackSources(n int) []net.IP { return loopbackSourcesFrom(0, n) }

// loopbackSourcesFrom are the n source addresses from 127.0.0.(2+first)
// on (the generator children of a pool use distinct ones).
func loopbackSourcesFrom(first, n int) []net.IP {
	out := make([]net.IP, n)
	for i := range out {
		k := first + i + 2
		out[i] = net.IPv4(127, byte(k>>16), byte(k>>8), byte(k))
	}
	return out
}

func newConnectFleet(addr, product string, logins []fleetLogin, interval time.Duration, perAddress int, backoffMin, backoffMax time.Duration) *connectFleet {
	f := &connectFleet{addr: addr, product: product, logins: logins, interval: interval,
		sources:    loopbackSources((len(logins) + perAddress - 1) / perAddress),
		backoffMin: backoffMin, backoffMax: backoffMax,
		keepAlive: uint16(min(max(60, 3*interval/time.Second), 65535)),
		devs:      make([]*simDev, len(logins)), connectQ: make(chan int, len(logins))}
	for i := range f.devs {
		f.devs[i] = &simDev{idx: i}
	}
	return f
}

// start begins connecting every device, conc dials at a time, and
// publishing reports; stop ends both.
func (f *connectFleet) start(conc int) {
	f.ctx, f.cancel = context.WithCancel(context.Background())
	for i := range f.devs {
		f.connectQ <- i
	}
	for range conc {
		f.wg.Add(1)
		go f.connector()
	}
	const shards = 4
	start := time.Now()
	for s := range shards {
		f.wg.Add(1)
		go f.publisher(start, s, shards)
	}
}

func (f *connectFleet) connector() {
	defer f.wg.Done()
	for {
		select {
		case <-f.ctx.Done():
			return
		case i := <-f.connectQ:
			f.dial(f.devs[i])
		}
	}
}

// dial connects d once; on failure it schedules the next attempt.
func (f *connectFleet) dial(d *simDev) {
	if f.closing.Load() {
		return
	}
	l := f.logins[d.idx]
	d.mu.Lock()
	no := d.connNo + 1
	d.mu.Unlock()
	willID := "w" + strconv.FormatUint(uint64(no), 10)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(f.ctx, 15*time.Second)
	c, err := mqttc.Dial(ctx, mqttc.Options{Addr: f.addr, LocalIP: f.sources[d.idx%len(f.sources)], Timeout: 15 * time.Second,
		Connect: mqttc.Connect{ClientID: l.ID, Username: l.SecureID, Password: l.Key, KeepAlive: f.keepAlive, CleanSession: true,
			Will: &mqttc.Will{Topic: "/" + f.product + "/" + l.ID + "/offline", Payload: []byte(`{"messageId":"` + willID + `"}`), QoS: 1}},
		OnClose: func(error) { f.onClose(d) }})
	cancel()
	if err != nil {
		f.dialFailures.Add(1)
		var refused mqttc.ConnackError
		if errors.As(err, &refused) {
			f.refused.Add(1)
		}
		f.retry(d)
		return
	}
	if h := f.connack.Load(); h != nil {
		h.Record(time.Since(t0))
	}
	d.mu.Lock()
	d.connNo, d.attempt, d.c = no, 0, c
	d.mu.Unlock()
	if f.closing.Load() {
		_ = c.Disconnect()
		return
	}
	f.connects.Add(1)
	f.connected.Add(1)
	birth := `{"messageId":"b` + strconv.FormatUint(uint64(no), 10) + `","timestamp":` + strconv.FormatInt(time.Now().UnixMilli(), 10) + `}`
	_ = c.Publish("/"+f.product+"/"+l.ID+"/online", []byte(birth), 1, false, func(err error) {
		if err == nil {
			f.birthsAcked.Add(1)
			d.mu.Lock()
			d.births = append(d.births, no)
			d.mu.Unlock()
		}
	})
}

// onClose runs when a device's connection is gone: reconnect, unless the
// fleet is stopping.
func (f *connectFleet) onClose(d *simDev) {
	d.mu.Lock()
	was := d.c != nil
	d.c = nil
	d.mu.Unlock()
	if was {
		f.connected.Add(-1)
	}
	if f.closing.Load() {
		return
	}
	f.lost.Add(1)
	f.retry(d)
}

// retry schedules d's next dial after a jittered exponential backoff:
// uniform in [0, min(max, min*2^attempt)] ("full jitter"), at least 50 ms.
func (f *connectFleet) retry(d *simDev) {
	d.mu.Lock()
	n := min(d.attempt, 16)
	d.attempt++
	d.mu.Unlock()
	b := backoff.Backoff{Min: f.backoffMin, Max: f.backoffMax, Jitter: 1}
	wait := max(50*time.Millisecond, b.Delay(n))
	time.AfterFunc(wait, func() {
		if f.closing.Load() {
			return
		}
		select {
		case f.connectQ <- d.idx:
		default: // cannot happen: the queue holds every device once
		}
	})
}

// publisher publishes the reports of devices s, s+shards, ... each at its
// own phase of the interval.
func (f *connectFleet) publisher(start time.Time, s, shards int) {
	defer f.wg.Done()
	n := len(f.devs)
	buf := make([]byte, 0, 160)
	for cycle := 0; ; cycle++ {
		base := start.Add(time.Duration(cycle) * f.interval)
		for i := s; i < n; i += shards {
			due := base.Add(time.Duration(int64(f.interval) * int64(i) / int64(n)))
			if w := time.Until(due); w > 0 {
				select {
				case <-f.ctx.Done():
					return
				case <-time.After(max(w, 5*time.Millisecond)):
				}
			}
			if f.ctx.Err() != nil {
				return
			}
			buf = f.report(f.devs[i], buf)
		}
	}
}

// report publishes one QoS 1 report of d, unless d is not connected or
// has 4 reports unacknowledged.
func (f *connectFleet) report(d *simDev, buf []byte) []byte {
	d.mu.Lock()
	c := d.c
	if c == nil || c.Pending() >= 4 {
		d.mu.Unlock()
		f.skipped.Add(1)
		return buf
	}
	d.seq++
	seq := d.seq
	d.mu.Unlock()
	now := time.Now()
	buf = append(buf[:0], `{"messageId":"`...)
	buf = strconv.AppendUint(buf, uint64(seq), 10)
	buf = append(buf, `","timestamp":`...)
	buf = strconv.AppendInt(buf, now.UnixMilli(), 10)
	buf = append(buf, `,"properties":{"temperature":`...)
	buf = strconv.AppendInt(buf, int64(seq%40), 10)
	buf = append(buf, `.5}}`...)
	f.sent.Add(1)
	_ = c.Publish("/"+f.product+"/"+f.logins[d.idx].ID+"/properties/report", buf, 1, false, func(err error) {
		if err != nil {
			f.ackFailed.Add(1)
			return
		}
		f.acked.Add(1)
		d.mu.Lock()
		d.acked = append(d.acked, seq)
		d.mu.Unlock()
	})
	return buf
}

// pauseReports stops publishing (connections stay up) and waits until
// every outstanding report is acknowledged or failed, at most wait.
func (f *connectFleet) pauseReports(wait time.Duration) {
	f.cancel()
	f.wg.Wait()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) && f.acked.Load()+f.ackFailed.Load()+int64(0) < f.sent.Load() {
		time.Sleep(50 * time.Millisecond)
	}
}

// closeAll ends every connection: with DISCONNECT (no will) or abruptly
// (the broker publishes each device's will). No device reconnects after.
func (f *connectFleet) closeAll(abrupt bool) {
	f.closing.Store(true)
	if f.cancel != nil {
		f.cancel()
	}
	f.wg.Wait()
	_ = forEach(context.Background(), len(f.devs), 32, func(_ context.Context, i int) error {
		d := f.devs[i]
		d.mu.Lock()
		c := d.c
		d.mu.Unlock()
		switch {
		case c == nil:
		case abrupt:
			_ = c.Close()
		default:
			_ = c.Disconnect()
		}
		return nil
	})
}

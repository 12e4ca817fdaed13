package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/schema/backoff"
)

// fleetLogin is one device's broker login: client id = ID, username =
// SecureID, password = Key.
type fleetLogin struct {
	ID, SecureID, Key string
}

// connackRefused is a CONNACK that refused the login (its return code).
type connackRefused byte

func (c connackRefused) Error() string {
	return "CONNACK refused, return code " + strconv.Itoa(int(c))
}

// tryLogin connects once to addr (host:port) as l over MQTT 3.1.1 (clean
// session), reads the CONNACK and disconnects: no paho client, so that a
// login check costs a dial and two small packets. It returns the time from
// the dial to the CONNACK; a refused login is a connackRefused error, a
// connection closed or timed out before any CONNACK another error.
func tryLogin(ctx context.Context, addr string, l fleetLogin, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	dialer := net.Dialer{Deadline: deadline}
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := c.Write(connectPacket(l)); err != nil {
		return 0, err
	}
	var ack [4]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return 0, fmt.Errorf("no CONNACK: %w", err)
	}
	took := time.Since(start)
	if ack[0] != 0x20 || ack[1] != 2 {
		return took, fmt.Errorf("not a CONNACK: % x", ack)
	}
	if ack[3] != 0 {
		return took, connackRefused(ack[3])
	}
	_, _ = c.Write([]byte{0xe0, 0}) // DISCONNECT
	return took, nil
}

// connectPacket is an MQTT 3.1.1 CONNECT with clean session, username and
// password, keep-alive 60 s.
func connectPacket(l fleetLogin) []byte {
	str := func(b []byte, s string) []byte {
		b = append(b, byte(len(s)>>8), byte(len(s)))
		return append(b, s...)
	}
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 4, 0xc2, 0, 60}
	body = str(body, l.ID)
	body = str(body, l.SecureID)
	body = str(body, l.Key)
	pkt := []byte{0x10}
	for n := len(body); ; {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		pkt = append(pkt, d)
		if n == 0 {
			break
		}
	}
	return append(pkt, body...)
}

// LoginCheck counts one series of login attempts, each tried once.
type LoginCheck struct {
	Tried    int `json:"tried"`
	Accepted int `json:"accepted"`
	// Refused got a CONNACK with a return code other than 0; Failed got
	// none (closed, timed out).
	Refused    int            `json:"refused"`
	Failed     int            `json:"failed"`
	FirstError string         `json:"firstError,omitempty"`
	Connack    LatencySummary `json:"connack"` // dial to CONNACK, accepted ones
}

func (c LoginCheck) String() string {
	s := fmt.Sprintf("%d of %d accepted, %d refused, %d failed, CONNACK %s", c.Accepted, c.Tried, c.Refused, c.Failed, c.Connack)
	if c.FirstError != "" {
		s += " (first error: " + c.FirstError + ")"
	}
	return s
}

// loginChecker tallies tryLogin results from several goroutines.
type loginChecker struct {
	mu    sync.Mutex
	check LoginCheck
	hist  Histogram
}

func (lc *loginChecker) record(took time.Duration, err error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.check.Tried++
	var refused connackRefused
	switch {
	case err == nil:
		lc.check.Accepted++
		lc.hist.Record(took)
	case errors.As(err, &refused):
		lc.check.Refused++
	default:
		lc.check.Failed++
	}
	if err != nil && lc.check.FirstError == "" {
		lc.check.FirstError = err.Error()
	}
}

func (lc *loginChecker) result() LoginCheck {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	c := lc.check
	c.Connack = lc.hist.Summary()
	return c
}

// checkLogins tries each login once, conc at a time.
func checkLogins(ctx context.Context, addr string, logins []fleetLogin, conc int) LoginCheck {
	var lc loginChecker
	_ = forEach(ctx, len(logins), conc, func(ctx context.Context, i int) error {
		lc.record(tryLogin(ctx, addr, logins[i], 10*time.Second))
		return nil
	})
	return lc.result()
}

// connectDevice connects a paho client as the device l (clean session, no
// reconnection): a connected device of the fleet.
func connectDevice(brokerURL string, l fleetLogin) (mqtt.Client, error) {
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(l.ID).
		SetUsername(l.SecureID).SetPassword(l.Key).SetCleanSession(true).SetAutoReconnect(false).
		SetConnectTimeout(10 * time.Second).SetWriteTimeout(30 * time.Second))
	t := c.Connect()
	if !t.WaitTimeout(15*time.Second) || t.Error() != nil {
		return nil, fmt.Errorf("bench: device %s connect: %v", l.ID, t.Error())
	}
	return c, nil
}

// PubackProbe is what a connected device saw while it published a QoS 1
// report every interval: the time from each publish to its PUBACK.
type PubackProbe struct {
	Seconds float64        `json:"seconds"`
	Sent    int64          `json:"sent"`
	Failed  int64          `json:"failed"` // no PUBACK within 10 s, or an error
	Puback  LatencySummary `json:"puback"`
}

func (p PubackProbe) String() string {
	return fmt.Sprintf("PUBACK %s over %.1fs, %d sent, %d failed", p.Puback, p.Seconds, p.Sent, p.Failed)
}

// pubackProber is one device publishing a QoS 1 report every interval on
// its own connection and timing each PUBACK, into the histogram of the
// window in force when the publish went out (a window per phase: quiet,
// during changes). A PUBACK that is late delays no later publish.
type pubackProber struct {
	c        mqtt.Client
	topic    string
	interval time.Duration
	cur      atomic.Pointer[probeWindow]
	tl       *timeline // every PUBACK, per second since the prober started
	stop     chan struct{}
	wg       sync.WaitGroup // the ticker loop and the waits in flight
}

type probeWindow struct {
	start        time.Time
	hist         Histogram
	sent, failed atomic.Int64
}

// startPubackProber connects device l to brokerURL and starts publishing
// to topic; no window is open until window is called.
func startPubackProber(brokerURL string, l fleetLogin, topic string, interval time.Duration) (*pubackProber, error) {
	c, err := connectDevice(brokerURL, l)
	if err != nil {
		return nil, err
	}
	p := &pubackProber{c: c, topic: topic, interval: interval, tl: &timeline{start: time.Now()}, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.loop()
	return p, nil
}

func (p *pubackProber) loop() {
	defer p.wg.Done()
	var k int64
	backoff.Every(p.stop, p.interval, func(time.Time) bool {
		w := p.cur.Load()
		k++
		start := time.Now()
		tok := p.c.Publish(p.topic, 1, false, `{"properties":{"probe":`+strconv.FormatInt(k, 10)+`}}`)
		if w == nil {
			return true
		}
		w.sent.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				w.failed.Add(1)
				p.tl.at(time.Now()).errs.Add(1)
				return
			}
			now := time.Now()
			d := now.Sub(start)
			w.hist.Record(d)
			p.tl.at(now).hist.Record(d)
		}()
		return true
	})
}

// window opens a new measuring window and returns the function that
// closes it and summarizes it (after the PUBACKs of its publishes came
// back or timed out).
func (p *pubackProber) window() func() PubackProbe {
	w := &probeWindow{start: time.Now()}
	p.cur.Store(w)
	return func() PubackProbe {
		end := time.Now()
		p.cur.CompareAndSwap(w, nil)
		deadline := time.Now().Add(11 * time.Second)
		for w.hist.Count()+w.failed.Load() < w.sent.Load() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		return PubackProbe{Seconds: end.Sub(w.start).Seconds(), Sent: w.sent.Load(), Failed: w.failed.Load(), Puback: w.hist.Summary()}
	}
}

// close stops publishing and disconnects; it returns the per-second
// timeline of every PUBACK.
func (p *pubackProber) close() []Second {
	close(p.stop)
	p.wg.Wait()
	p.c.Disconnect(100)
	return p.tl.seconds()
}

package bench

import (
	"context"
	"devicehub/ingest/wire"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// FleetChurn is phases 3 and 4: a connected device's PUBACKs, quiet and
// while devices are deployed, undeployed and given new keys through the
// single-device API calls at a paced rate, with the broker holding the
// whole fleet's logins; and each deployed device logging in the moment
// its deploy call returned.
type FleetChurn struct {
	Logins int         `json:"logins"` // device logins the broker held
	Quiet  PubackProbe `json:"quiet"`
	During PubackProbe `json:"during"`
	// Ops: the paced calls (rate, errors; latency from each call's
	// scheduled start, so a stall shows); Kinds: each kind's own calls.
	Ops   LoadResult  `json:"ops"`
	Kinds []ChurnKind `json:"kinds"`
	// DeployConnect: each deployed device's one login, its CONNACK time
	// counted from its deploy call's return.
	DeployConnect LoginCheck `json:"deployConnect"`
	// Revoked: the old login of each undeployed or rotated device, tried
	// once the moment its call returned.
	Revoked    RevokeCheck `json:"revoked"`
	QuietPhase FleetPhase  `json:"quietPhase"`
	Phase      FleetPhase  `json:"phase"`
	// Timeline: PUBACKs per second, quiet then churn.
	Timeline []Second `json:"timeline"`
}

// ChurnKind is one kind of churn call.
type ChurnKind struct {
	Kind       string         `json:"kind"` // deploy, undeploy, rotate
	Calls      int64          `json:"calls"`
	Errors     int64          `json:"errors"`
	FirstError string         `json:"firstError,omitempty"`
	Latency    LatencySummary `json:"latency"`
}

func (f FleetChurn) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "churn at %d logins: %s\n    PUBACK quiet  %s\n    PUBACK during %s", f.Logins, f.Ops, f.Quiet, f.During)
	for _, k := range f.Kinds {
		fmt.Fprintf(&b, "\n    %-8s %d calls, %d errors, %s", k.Kind, k.Calls, k.Errors, k.Latency)
		if k.FirstError != "" {
			fmt.Fprintf(&b, " (first error: %s)", k.FirstError)
		}
	}
	fmt.Fprintf(&b, "\n    deploy -> CONNACK: %s\n    old login right after undeploy/rotate: %s\n    %s\n    %s",
		f.DeployConnect, f.Revoked, f.QuietPhase, f.Phase)
	return b.String()
}

// RevokeCheck counts old logins tried right after the call that ended
// them returned: each should be refused; one let in is a breach.
type RevokeCheck struct {
	Tried      int    `json:"tried"`
	Refused    int    `json:"refused"`
	LetIn      int    `json:"letIn"`
	Failed     int    `json:"failed"` // no CONNACK at all
	FirstError string `json:"firstError,omitempty"`
}

func (r RevokeCheck) String() string {
	s := fmt.Sprintf("%d of %d refused, %d let in, %d failed", r.Refused, r.Tried, r.LetIn, r.Failed)
	if r.FirstError != "" {
		s += " (first error: " + r.FirstError + ")"
	}
	return s
}

// churnDevice is one device of the churn pool; mu orders its calls.
type churnDevice struct {
	mu       sync.Mutex
	login    fleetLogin
	deployed bool
	rotate   bool // the next call on it while deployed is a rotation (else an undeploy); set by a deploy
}

// churnKinds times each kind of call.
type churnKinds struct {
	mu    sync.Mutex
	kinds map[string]*churnKindStats
}

type churnKindStats struct {
	hist   Histogram
	errs   int64
	first  string
	called int64
}

func (c *churnKinds) record(kind string, d time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.kinds[kind]
	if s == nil {
		s = &churnKindStats{}
		c.kinds[kind] = s
	}
	s.called++
	if err != nil {
		s.errs++
		if s.first == "" {
			s.first = err.Error()
		}
		return
	}
	s.hist.Record(d)
}

func (c *churnKinds) result() []ChurnKind {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ChurnKind
	for _, k := range []string{"deploy", "undeploy", "rotate"} {
		if s := c.kinds[k]; s != nil {
			out = append(out, ChurnKind{Kind: k, Calls: s.called, Errors: s.errs, FirstError: s.first, Latency: s.hist.Summary()})
		}
	}
	return out
}

func (e *fleetEnv) churn(ctx context.Context) (*FleetChurn, error) {
	p := e.p
	res := &FleetChurn{Logins: max(p.Logins, len(e.logins))}
	// The probe is the last device of phase 1, the pool the ones before
	// it after those phase 5 uses.
	probeLogin := e.logins[len(e.logins)-1]
	first := min(max(p.IngestDevices, 0), len(e.logins)-1)
	poolLogins := e.logins[first : len(e.logins)-1]
	n := int(p.Churn.Seconds() * float64(p.ChurnRate))
	// Each device of the pool goes through undeploy, deploy, rotate in
	// turn: a pool of a third of the calls (at most ChurnPool) makes the
	// three kinds equal.
	if size := min(p.ChurnPool, max(n/3, 1)); len(poolLogins) > size {
		poolLogins = poolLogins[:size]
	}
	if len(poolLogins) == 0 {
		return nil, fmt.Errorf("bench: fleet churn: no devices left for the pool (%d devices, %d for phase 5)", len(e.logins), p.IngestDevices)
	}
	pool := make([]*churnDevice, len(poolLogins))
	for i, l := range poolLogins {
		pool[i] = &churnDevice{login: l, deployed: true}
	}
	probe, err := startPubackProber(e.broker.url(), probeLogin, wire.DeviceTopic(e.product, probeLogin.ID, wire.LevelReport), p.ProbeInterval)
	if err != nil {
		return nil, err
	}
	defer func() {
		if probe != nil {
			probe.close()
		}
	}()

	meter := startFleetPhase("PUBACK, quiet", e.procs())
	quiet := probe.window()
	if err := sleepCtx(ctx, p.Baseline); err != nil {
		return nil, err
	}
	res.Quiet = quiet()
	res.QuietPhase = meter.end(res.Quiet.Sent, "probe")

	kinds := &churnKinds{kinds: map[string]*churnKindStats{}}
	var connected, revoked loginChecker
	addr := e.broker.addr()
	op := func(ctx context.Context, i int) error {
		d := pool[i%len(pool)]
		d.mu.Lock()
		defer d.mu.Unlock()
		id := d.login.ID
		var kind string
		var err error
		t0 := time.Now()
		switch {
		case !d.deployed:
			kind = "deploy"
			if err = e.child.call(ctx, "POST", "/api/device/instance/"+id+"/deploy", nil, nil); err == nil {
				returned := time.Now()
				d.deployed, d.rotate = true, true
				_, cerr := tryLogin(ctx, addr, d.login, 10*time.Second)
				connected.record(time.Since(returned), cerr)
			}
		case d.rotate:
			kind = "rotate"
			var out struct {
				Configuration struct {
					SecureKey string `json:"secureKey"`
				} `json:"configuration"`
			}
			if err = e.child.call(ctx, "POST", "/api/device/instance/"+id+"/secret", nil, &out); err == nil {
				old := d.login
				d.login.Key, d.rotate = out.Configuration.SecureKey, false
				if d.login.Key == "" || strings.Contains(d.login.Key, "*") {
					err = fmt.Errorf("bench: rotate %s: no new key in the answer", id)
				}
				revoked.record(tryLogin(ctx, addr, old, 10*time.Second))
			}
		default:
			kind = "undeploy"
			if err = e.child.call(ctx, "POST", "/api/device/instance/"+id+"/undeploy", nil, nil); err == nil {
				d.deployed = false
				revoked.record(tryLogin(ctx, addr, d.login, 10*time.Second))
			}
		}
		kinds.record(kind, time.Since(t0), err)
		return err
	}
	meter = startFleetPhase("PUBACK, churn", e.procs())
	during := probe.window()
	// Bounded: n calls at the rate, each within the API's own bounds
	// (LoginWait) and the client's request timeout.
	cctx, cancel := context.WithTimeout(ctx, p.Churn+2*time.Minute)
	res.Ops, err = runLoad(cctx, loadSpec{Name: "churn", Concurrency: p.Workers, Requests: n, Rate: float64(p.ChurnRate), Do: op})
	cancel()
	res.During = during()
	res.Phase = meter.end(res.Ops.Requests+res.Ops.Errors, "call")
	res.Timeline = probe.close()
	probe = nil
	if err != nil {
		return nil, err
	}
	res.Kinds = kinds.result()
	res.DeployConnect = connected.result()
	rv := revoked.result()
	res.Revoked = RevokeCheck{Tried: rv.Tried, Refused: rv.Refused, LetIn: rv.Accepted, Failed: rv.Failed}
	if rv.Failed > 0 {
		res.Revoked.FirstError = rv.FirstError
	}
	if res.Ops.Requests == 0 {
		return res, errors.New("bench: fleet churn: no call succeeded: " + res.Ops.FirstError)
	}
	return res, nil
}

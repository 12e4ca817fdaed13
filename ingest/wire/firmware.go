package wire

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"devicehub/schema"
)

// Limits of a firmware report's fields (characters).
const (
	MaxFirmwareVersionLen = 64
	MaxFirmwareReasonLen  = 512
)

// FirmwareUpgrade is the message devicehub sends a device on
// /{p}/{d}/firmware/upgrade (ingest/firmware sends it through ingest/link,
// bench/fwdevice's simulated device reads it; the protocol is README
// "Firmware updates"): the package to download and install.
type FirmwareUpgrade struct {
	MessageID string `json:"messageId"`
	RolloutID string `json:"rolloutId"`
	Version   string `json:"version"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	Signature string `json:"signature,omitempty"`
	URL       string `json:"url"`
	Expires   int64  `json:"expires"`   // epoch ms when the URL stops working
	Timestamp int64  `json:"timestamp"` // epoch ms
}

// FirmwareProgress is a device's report on .../firmware/progress
// {messageId?, timestamp?, rolloutId, version, state, progress?, reason?}.
type FirmwareProgress struct {
	RolloutID string
	Version   string
	State     string // DOWNLOADING, DOWNLOADED, VERIFIED, UPDATING, UPDATED or FAILED
	Progress  int    // 0-100, with DOWNLOADING
	Reason    string // with FAILED
}

var progressStates = map[string]bool{"DOWNLOADING": true, "DOWNLOADED": true, "VERIFIED": true,
	"UPDATING": true, "UPDATED": true, "FAILED": true}

// DecodeFirmwareProgress decodes a progress report into out (may be nil)
// and appends its message row. rolloutId, version and a known state are
// required; progress is a number 0-100 (clamped), a reason is cut to
// MaxFirmwareReasonLen. The strings of out are copies: they outlive the
// payload.
func DecodeFirmwareProgress(dst *Rows, t Topic, payload []byte, now time.Time, out *FirmwareProgress) error {
	if err := checkSize(payload); err != nil {
		return err
	}
	var h header
	var p FirmwareProgress
	s := scanner{b: payload}
	err := s.object(0, func(key string) error {
		if ok, err := h.field(&s, key); ok {
			return err
		}
		var err error
		switch key {
		case "rolloutId":
			p.RolloutID, err = s.scalarString()
		case "version":
			p.Version, err = s.scalarString()
		case "state":
			p.State, err = s.scalarString()
		case "reason":
			p.Reason, err = s.scalarString()
		case "progress":
			if s.peek() == 'n' {
				return s.lit("null")
			}
			num, err := s.number()
			if err != nil {
				return err
			}
			f, err := strconv.ParseFloat(string(num), 64)
			if err != nil {
				return fmt.Errorf("progress: %w", ErrMalformed)
			}
			p.Progress = int(min(max(f, 0), 100))
			return nil
		default:
			err = s.skip(0)
		}
		return err
	})
	if err == nil {
		err = s.end()
	}
	switch {
	case err != nil:
	case p.RolloutID == "" || len(p.RolloutID) > 64:
		err = fmt.Errorf("rolloutId missing or too long: %w", ErrMalformed)
	case p.Version == "" || len(p.Version) > MaxFirmwareVersionLen:
		err = fmt.Errorf("version missing or too long: %w", ErrMalformed)
	case !progressStates[p.State]:
		err = fmt.Errorf("state %q: %w", schema.Truncate(p.State, 32), ErrMalformed)
	}
	if err != nil {
		return fmt.Errorf("firmware progress from %q: %w", t.DeviceID, err)
	}
	if out != nil {
		*out = FirmwareProgress{RolloutID: strings.Clone(p.RolloutID), Version: strings.Clone(p.Version),
			State: strings.Clone(p.State), Progress: p.Progress, Reason: strings.Clone(schema.Truncate(validUTF8(p.Reason), MaxFirmwareReasonLen))}
	}
	dst.Msgs = append(dst.Msgs, h.message(dst, t, payload, now))
	return nil
}

// DecodeFirmwareVersion decodes a version report {version, timestamp?,
// messageId?}: the version (required, a copy) into out (may be nil), and
// its message row.
func DecodeFirmwareVersion(dst *Rows, t Topic, payload []byte, now time.Time, out *string) error {
	if err := checkSize(payload); err != nil {
		return err
	}
	var h header
	var v string
	s := scanner{b: payload}
	err := s.object(0, func(key string) error {
		if ok, err := h.field(&s, key); ok {
			return err
		}
		if key == "version" {
			var err error
			v, err = s.scalarString()
			return err
		}
		return s.skip(0)
	})
	if err == nil {
		err = s.end()
	}
	if err == nil && (v == "" || len(v) > MaxFirmwareVersionLen) {
		err = fmt.Errorf("version missing or too long: %w", ErrMalformed)
	}
	if err != nil {
		return fmt.Errorf("firmware version from %q: %w", t.DeviceID, err)
	}
	if out != nil {
		*out = strings.Clone(v)
	}
	dst.Msgs = append(dst.Msgs, h.message(dst, t, payload, now))
	return nil
}

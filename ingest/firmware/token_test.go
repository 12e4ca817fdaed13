package firmware

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestToken: a token reads back as signed, with the digest of the
// credentials it was signed for (and no other's); a changed body, a
// changed MAC, another key's token, a body of an unknown shape are
// ErrBadToken; a token past its expiry is ErrExpired with its grant.
func TestToken(t *testing.T) {
	s := NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Now()
	g := Grant{DeviceID: "dev-1", PackageID: "pkg-1", Expires: now.Add(time.Minute).Truncate(time.Millisecond)}
	tok := s.Sign(g, "sid-1", "key-1")
	got, err := s.Check(tok, now)
	if err != nil || got.DeviceID != g.DeviceID || got.PackageID != g.PackageID || !got.Expires.Equal(g.Expires) {
		t.Fatalf("check: %+v %v", got, err)
	}
	if !s.SameCred(got, "sid-1", "key-1") {
		t.Fatal("the credentials signed for do not match")
	}
	for _, c := range [][2]string{{"sid-1", "key-2"}, {"sid-2", "key-1"}, {"sid-1k", "ey-1"}, {"", "sid-1key-1"}} {
		if s.SameCred(got, c[0], c[1]) {
			t.Errorf("credentials %q match a token signed for sid-1/key-1", c)
		}
	}
	if s.SameCred(Grant{}, "sid-1", "key-1") {
		t.Error("a grant without a digest (the earlier format) matches")
	}
	enc, mac, _ := strings.Cut(tok, ".")
	body, _ := base64.RawURLEncoding.DecodeString(enc)
	b64 := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	for name, bad := range map[string]string{
		"no dot":          enc,
		"body changed":    b64(bytes.Replace(body, []byte("dev-1"), []byte("dev-2"), 1)) + "." + mac,
		"mac changed":     enc + "." + b64(make([]byte, 32)),
		"another key":     NewSigner([]byte("another key")).Sign(g, "sid-1", "key-1"),
		"not base64":      "!!." + mac,
		"unknown version": signBody(s, "3\ndev-1\npkg-1\n1\n"+b64(make([]byte, credLen))),
		"short digest":    signBody(s, "2\ndev-1\npkg-1\n1\n"+b64(make([]byte, 8))),
		"four fields":     signBody(s, "dev-1\npkg-1\n1\nx"),
	} {
		if _, err := s.Check(bad, now); !errors.Is(err, ErrBadToken) {
			t.Errorf("%s: %v, want ErrBadToken", name, err)
		}
	}
	// The earlier format, signed with this key: read, without a digest.
	old, err := s.Check(signBody(s, "dev-1\npkg-1\n"+itoa(int(now.Add(time.Minute).UnixMilli()))), now)
	if err != nil || old.DeviceID != "dev-1" || old.Cred != nil {
		t.Fatalf("the earlier format: %+v %v", old, err)
	}
	if got, err := s.Check(tok, g.Expires); !errors.Is(err, ErrExpired) || got.DeviceID != "dev-1" {
		t.Fatalf("expired: %+v %v", got, err)
	}
}

func signBody(s *Signer, body string) string {
	enc := base64.RawURLEncoding.EncodeToString([]byte(body))
	return enc + "." + base64.RawURLEncoding.EncodeToString(s.mac(enc))
}

// BenchmarkDownloadCheck is what a download's token and credentials cost
// now: the token's MAC, its body read, and the credentials' digest.
func BenchmarkDownloadCheck(b *testing.B) {
	s := NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Now()
	tok := s.Sign(Grant{DeviceID: "device-000042", PackageID: "0123456789abcdef", Expires: now.Add(time.Hour)}, "device-000042", "0123456789abcdef0123456789abcdef")
	b.ReportAllocs()
	for b.Loop() {
		g, err := s.Check(tok, now)
		if err != nil || !s.SameCred(g, "device-000042", "0123456789abcdef0123456789abcdef") {
			b.Fatal("refused")
		}
	}
}

// TestUpgradeLinkCredentials: the link an engine's step sends a device is
// bound to that device's credentials as stored when it was started (read
// by the start), not to another's.
func TestUpgradeLinkCredentials(t *testing.T) {
	ms, svc, sent, _ := setup(t, 3, 600)
	ctx := context.Background()
	if _, err := ms.DB().ExecContext(ctx, `UPDATE devices SET secure_key = 'key-of-' || id WHERE product_id = 'fp'`); err != nil {
		t.Fatal(err)
	}
	epoch, err := svc.store.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Step(ctx, epoch); err != nil {
		t.Fatal(err)
	}
	if n, _ := sent.count(); n != 3 {
		t.Fatalf("%d devices sent an upgrade, want 3", n)
	}
	for dev, ups := range sent.got {
		tok := ups[0].URL[strings.LastIndex(ups[0].URL, "/")+1:]
		g, err := svc.signer.Check(tok, time.Now())
		if err != nil || g.DeviceID != dev {
			t.Fatalf("%s: %+v %v", dev, g, err)
		}
		if !svc.signer.SameCred(g, dev, "key-of-"+dev) {
			t.Errorf("%s: the link is not bound to the device's credentials", dev)
		}
		if other := "fd-1"; other != dev && svc.signer.SameCred(g, other, "key-of-"+other) {
			t.Errorf("%s: the link matches %s's credentials", dev, other)
		}
	}
}

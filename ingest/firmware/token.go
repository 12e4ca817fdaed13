package firmware

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

var randRead = rand.Read

// Token errors.
var (
	// ErrBadToken: the token is not one devicehub signed (404: an unknown
	// token).
	ErrBadToken = errors.New("firmware: unknown download token")
	// ErrExpired: the token's time is over.
	ErrExpired = errors.New("firmware: download token expired")
)

// Grant is what a download token binds: one device, one package, until
// an expiry.
type Grant struct {
	DeviceID  string
	PackageID string
	Expires   time.Time
}

// Signer makes and checks download tokens with an HMAC-SHA256 key that
// every instance shares (Store.TokenKey).
type Signer struct{ key []byte }

// NewSigner signs with key.
func NewSigner(key []byte) *Signer { return &Signer{key: append([]byte(nil), key...)} }

// Sign is g's token: base64url("device\npackage\nexpiry-ms") "." base64url(HMAC).
func (s *Signer) Sign(g Grant) string {
	body := g.DeviceID + "\n" + g.PackageID + "\n" + strconv.FormatInt(g.Expires.UnixMilli(), 10)
	enc := base64.RawURLEncoding.EncodeToString([]byte(body))
	return enc + "." + base64.RawURLEncoding.EncodeToString(s.mac(enc))
}

func (s *Signer) mac(enc string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(enc))
	return m.Sum(nil)
}

// Check reads a token: ErrBadToken when it is not one this key signed;
// the grant and ErrExpired when its time is over at now.
func (s *Signer) Check(token string, now time.Time) (Grant, error) {
	enc, sig, ok := strings.Cut(token, ".")
	if !ok {
		return Grant{}, ErrBadToken
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(enc)) {
		return Grant{}, ErrBadToken
	}
	body, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return Grant{}, ErrBadToken
	}
	parts := strings.Split(string(body), "\n")
	if len(parts) != 3 {
		return Grant{}, ErrBadToken
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return Grant{}, ErrBadToken
	}
	g := Grant{DeviceID: parts[0], PackageID: parts[1], Expires: time.UnixMilli(ms)}
	if !now.Before(g.Expires) {
		return g, ErrExpired
	}
	return g, nil
}

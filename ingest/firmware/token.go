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
	// ErrBadToken: the token is not one devicehub signed (404: an
	// unknown token).
	ErrBadToken = errors.New("firmware: unknown download token")
	// ErrExpired: the token's time is over.
	ErrExpired = errors.New("firmware: download token expired")
)

// Grant is what a download token binds: one device, one package, until
// an expiry, and the device's credentials when the link was signed (as
// Cred, a digest of them: the token never carries the key itself).
type Grant struct {
	DeviceID  string
	PackageID string
	Expires   time.Time
	Cred      []byte // CredDigest of the device's secureId and secureKey at signing
}

// Signer makes and checks download tokens with an HMAC-SHA256 key that
// every instance shares (Store.TokenKey).
type Signer struct{ key []byte }

// NewSigner signs with key.
func NewSigner(key []byte) *Signer { return &Signer{key: append([]byte(nil), key...)} }

// tokenVersion begins a token's body. A body of the format before it,
// "device\npackage\nexpiry-ms" (signed by an instance of an earlier
// release, still in flight while instances are upgraded), is read with
// no Cred: its download checks the credentials with a lookup, as for a
// rotated key (api's downloadFirmware), and keeps working until it
// expires.
const tokenVersion = "2"

// credLen is how much of the credentials' HMAC a token keeps: 128 bits.
// The digest is keyed with the token key, so whoever holds a token can
// neither compute it for a guessed key offline nor learn the key from
// it; a download with wrong credentials matches it by chance with
// probability 2^-128, and each try is an HTTP request.
const credLen = 16

// CredDigest is what a token keeps of a device's credentials:
// HMAC(key, "cred\n" len(secureID) "\n" secureID secureKey), truncated to
// 16 bytes. The length prefix keeps two different pairs from sharing a
// message; "cred\n" keeps it apart from a token's own MAC, whose message
// (base64url) has no newline.
func (s *Signer) CredDigest(secureID, secureKey string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("cred\n" + strconv.Itoa(len(secureID)) + "\n" + secureID + secureKey))
	return m.Sum(nil)[:credLen]
}

// SameCred reports whether secureID and secureKey are the credentials g
// was signed for (in constant time).
func (s *Signer) SameCred(g Grant, secureID, secureKey string) bool {
	return len(g.Cred) == credLen && hmac.Equal(g.Cred, s.CredDigest(secureID, secureKey))
}

// Sign is g's token for a device whose credentials are secureID and
// secureKey: base64url("2\ndevice\npackage\nexpiry-ms\ncred") "."
// base64url(HMAC), cred being base64url(CredDigest).
func (s *Signer) Sign(g Grant, secureID, secureKey string) string {
	body := tokenVersion + "\n" + g.DeviceID + "\n" + g.PackageID + "\n" + strconv.FormatInt(g.Expires.UnixMilli(), 10) +
		"\n" + base64.RawURLEncoding.EncodeToString(s.CredDigest(secureID, secureKey))
	enc := base64.RawURLEncoding.EncodeToString([]byte(body))
	return enc + "." + base64.RawURLEncoding.EncodeToString(s.mac(enc))
}

func (s *Signer) mac(enc string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(enc))
	return m.Sum(nil)
}

// Check reads a token: ErrBadToken when it is not one this key signed;
// the grant and ErrExpired when its time is over at now. A token of the
// earlier format has no Cred.
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
	var cred []byte
	switch {
	case len(parts) == 5 && parts[0] == tokenVersion:
		if cred, err = base64.RawURLEncoding.DecodeString(parts[4]); err != nil || len(cred) != credLen {
			return Grant{}, ErrBadToken
		}
		parts = parts[1:4]
	case len(parts) == 3: // the earlier format: no Cred
	default:
		return Grant{}, ErrBadToken
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return Grant{}, ErrBadToken
	}
	g := Grant{DeviceID: parts[0], PackageID: parts[1], Expires: time.UnixMilli(ms), Cred: cred}
	if !now.Before(g.Expires) {
		return g, ErrExpired
	}
	return g, nil
}

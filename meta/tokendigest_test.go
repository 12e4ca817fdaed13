package meta_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"devicehub/meta"
)

// TestTokenDigest: a token's digest is the SHA-256 its TokenID is the hex
// of, for tokens of every length (those past the 128 bytes hashed on the
// stack too), and ParseTokenID gives it back from the TokenID; text that
// is no TokenID names no digest.
func TestTokenDigest(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"", "t", strings.Repeat("a", 127), strings.Repeat("b", 128), strings.Repeat("c", 129), strings.Repeat("x", 5000), meta.KeyPrefix + "secret"} {
		d := meta.TokenDigest(token)
		if d != sha256.Sum256([]byte(token)) {
			t.Errorf("len %d: digest is not the SHA-256", len(token))
		}
		id := meta.TokenID(token)
		if id != hex.EncodeToString(d[:]) {
			t.Errorf("len %d: TokenID %s is not the digest's hex", len(token), id)
		}
		if p, ok := meta.ParseTokenID(id); !ok || p != d {
			t.Errorf("len %d: ParseTokenID(%s) = %x, %v", len(token), id, p, ok)
		}
	}
	for _, id := range []string{"", "*", "abc", strings.Repeat("g", 64), strings.Repeat("a", 63), strings.Repeat("a", 66)} {
		if _, ok := meta.ParseTokenID(id); ok {
			t.Errorf("ParseTokenID(%q) names a digest", id)
		}
	}
}

package api

import (
	"testing"
	"time"

	"devicehub/meta"
)

func TestTokenCache(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := newTokenCache(5*time.Second, 2)
	u := meta.User{ID: "u1"}
	c.put("a", u, now.Add(time.Minute), now)
	if got, ok := c.get("a", now.Add(4*time.Second)); !ok || got.ID != "u1" {
		t.Fatal("fresh entry missed")
	}
	if _, ok := c.get("a", now.Add(5*time.Second)); ok {
		t.Fatal("entry served past its TTL")
	}
	c.put("b", u, now.Add(2*time.Second), now)
	if _, ok := c.get("b", now.Add(2*time.Second)); ok {
		t.Fatal("entry served past the token's expiry")
	}
	c.put("c", u, now.Add(time.Minute), now)
	c.evict("c")
	if _, ok := c.get("c", now); ok {
		t.Fatal("evicted entry served")
	}
	for _, k := range []string{"x", "y", "z"} {
		c.put(k, u, now.Add(time.Minute), now)
	}
	if len(c.m) > 2 {
		t.Fatalf("cache grew past its bound: %d", len(c.m))
	}
	off := newTokenCache(0, 10)
	off.put("a", u, now.Add(time.Minute), now)
	if _, ok := off.get("a", now); ok {
		t.Fatal("disabled cache served an entry")
	}
}

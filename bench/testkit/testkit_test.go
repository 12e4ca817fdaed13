package testkit

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestWithin: a condition that comes true is seen, one that never does
// is reported false once the timeout has passed, not before.
func TestWithin(t *testing.T) {
	var n atomic.Int32
	if !Within(5*time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("a condition true on its third check was not seen")
	}
	start := time.Now()
	if Within(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition never true was reported true")
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("gave up after %s, before the 50 ms timeout", waited)
	}
}

// TestAPI: a call sends the token and JSON body and decodes the
// envelope's result; an answer other than 200 is a StatusError carrying
// the envelope.
func TestAPI(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /ok", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Access-Token") != "tok" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, `{"message":"no token","status":401,"code":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		w.Write([]byte(`{"message":"success","result":{"n":7},"status":200,"timestamp":1}`))
	})
	mux.HandleFunc("GET /bad", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		w.Write([]byte(`{"message":"bad","status":400,"code":"illegal_argument","timestamp":1}`))
	})
	srv := &http.Server{Handler: mux}
	base := Serve(t, srv.Serve, srv.Shutdown)
	a := API{Base: base, Token: "tok"}
	var out struct{ N int }
	a.Call(t, "POST", "/ok", map[string]any{"x": 1}, &out)
	if out.N != 7 {
		t.Fatalf("result %+v, want n 7", out)
	}
	err := a.Try("GET", "/bad", nil, nil)
	if StatusOf(err) != 400 {
		t.Fatalf("GET /bad: %v, want a 400 StatusError", err)
	}
	if r := a.Send(t, "GET", "/bad", nil); r.Code != "illegal_argument" || r.Message != "bad" {
		t.Fatalf("envelope %+v", r.Envelope)
	}
	if err := a.WithToken("").Try("POST", "/ok", "{}", nil); StatusOf(err) != 401 {
		t.Fatalf("without the token: %v, want 401", err)
	}
}

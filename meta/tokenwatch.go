// The token watcher: WatchTokens hears, through PostgreSQL LISTEN, the
// TokenIDs of tokens that ended or whose permissions changed, on every instance.

package meta

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Ended tokens are announced to every instance: the triggers of
// schema/postgres/00010_token_revocations.sql send, as the transaction
// that ends them commits, the TokenIDs of tokens logged out or of a user
// disabled or deleted, comma-separated, or "*" when every token may have
// ended (TRUNCATE). Those of 00011_role_permissions.sql send the tokens
// whose permissions changed (their user's roles, those roles' grants or
// state): they have not ended, but a cache must read them again. Expiry is not announced: whoever checked a token knows
// when it expires.
const tokenChannel = "devicehub_tokens"

// WatchTokens calls ended with the TokenIDs of tokens that ended, through
// any instance or psql, within milliseconds of the commit; ended(nil)
// means that some may have ended unannounced (the watcher started
// listening, or listens again after losing its connection, or the table
// was truncated): check every token again. ended runs on the watcher's
// goroutine, one call at a time; it must not block. The watcher holds one
// PostgreSQL connection (beyond Options.MaxOpenConns) while any
// registration is open; Stop the registration, or Close the store, to end
// it.
func (s *Store) WatchTokens(ended func(ids []string)) *TokenWatch {
	t := &TokenWatch{w: s.tokens}
	s.tokens.add(t, ended)
	return t
}

// TokenWatch is one registration of WatchTokens.
type TokenWatch struct{ w *tokenWatch }

// Listening reports whether the watcher hears announcements now. While
// it does not, a token may end unannounced: a cache of tokens must not be
// trusted then (ended(nil) follows when it listens again).
func (t *TokenWatch) Listening() bool { return t != nil && t.w.live.Load() }

// Stop ends the registration: ended is not called after it returns.
func (t *TokenWatch) Stop() {
	if t != nil {
		t.w.remove(t)
	}
}

// tokenWatch is the store's one listener on tokenChannel, running while
// a registration is open.
type tokenWatch struct {
	dsn  string
	live atomic.Bool // listening

	mu     sync.Mutex // registrations and the listener's life; held while ended runs
	subs   map[*TokenWatch]func([]string)
	stop   chan struct{} // closed to stop the running listener; nil when none runs
	done   chan struct{} // closed when it has stopped
	closed bool
}

func newTokenWatch(dsn string) *tokenWatch {
	return &tokenWatch{dsn: dsn, subs: map[*TokenWatch]func([]string){}}
}

func (w *tokenWatch) add(t *TokenWatch, ended func([]string)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.subs[t] = ended
	if w.stop == nil {
		w.stop, w.done = make(chan struct{}), make(chan struct{})
		go w.run(w.stop, w.done)
	}
}

func (w *tokenWatch) remove(t *TokenWatch) {
	w.mu.Lock()
	delete(w.subs, t)
	if len(w.subs) > 0 || w.stop == nil {
		w.mu.Unlock()
		return
	}
	done := w.halt()
	w.mu.Unlock()
	<-done
}

// close stops the listener for good (Store.Close).
func (w *tokenWatch) close() {
	w.mu.Lock()
	w.closed = true
	clear(w.subs)
	done := w.halt()
	w.mu.Unlock()
	<-done
}

// halt tells the running listener, if any, to stop and returns what is
// closed once it has; w.mu is held.
func (w *tokenWatch) halt() <-chan struct{} {
	if w.stop == nil {
		done := make(chan struct{})
		close(done)
		return done
	}
	close(w.stop)
	done := w.done
	w.stop, w.done = nil, nil
	return done
}

// tell calls every registration's ended with ids.
func (w *tokenWatch) tell(stop <-chan struct{}, ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-stop: // halted: its registrations are gone, or belong to the next listener
		return
	default:
	}
	for _, ended := range w.subs {
		ended(ids)
	}
}

// run listens on tokenChannel until stop is closed, reconnecting as
// needed, and tells the registrations what it hears.
func (w *tokenWatch) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	defer w.live.Store(false)
	// A refused LISTEN returns at once: tokens are never cached (Listening
	// is false).
	_ = Listen(w.dsn, []string{tokenChannel}, ListenHandler{
		Lost: func() { w.live.Store(false) },
		Listening: func() { // tokens may have ended while it was not listening
			w.live.Store(true)
			w.tell(stop, nil)
		},
		Notify: func(_, payload string) {
			if payload == "*" {
				w.tell(stop, nil)
			} else {
				w.tell(stop, strings.Split(payload, ","))
			}
		},
	}, stop)
}

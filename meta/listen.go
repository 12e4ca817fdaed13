package meta

import (
	"fmt"
	"time"

	"github.com/lib/pq"
)

// ListenHandler is what a LISTEN connection (Listen) tells its user. Each
// field may be nil; they are called one at a time, Lost from lib/pq's
// connection goroutine, the others from Listen's.
type ListenHandler struct {
	// Notify is called with each announcement, in commit order.
	Notify func(channel, payload string)
	// Listening is called once every channel is listened to, and again
	// after each reconnection: announcements made while the connection
	// was down are lost, so the user must assume anything changed.
	Listening func()
	// Lost is called when the connection is lost or cannot be made;
	// Listening follows once it is back.
	Lost func()
}

// listenPing is how often an idle LISTEN connection is pinged: a dead
// connection is noticed, and re-established, only when it is used.
const listenPing = 5 * time.Second

// Listen LISTENs on channels, on a connection of its own to the database
// of dsn (lib/pq form), until stop is closed, re-establishing the
// connection after every loss. It is the one LISTEN loop of devicehub:
// the page cache, token ends, device-status watches and the live bus run
// on it. It blocks; it returns nil once stop is closed (also while
// PostgreSQL cannot be reached: it waits for a first connection until
// then), and an error when PostgreSQL refuses a LISTEN.
func Listen(dsn string, channels []string, h ListenHandler, stop <-chan struct{}) error {
	events := func(ev pq.ListenerEventType, _ error) {
		if (ev == pq.ListenerEventDisconnected || ev == pq.ListenerEventConnectionAttemptFailed) && h.Lost != nil {
			h.Lost()
		}
	}
	l := pq.NewListener(dsn, 100*time.Millisecond, 5*time.Second, events)
	done, closed := make(chan struct{}), make(chan struct{})
	go func() { // l.Listen waits for a connection: closing l ends the wait
		select {
		case <-stop:
		case <-done:
		}
		_ = l.Close()
		close(closed)
	}()
	defer func() { close(done); <-closed }()
	for _, c := range channels {
		if err := l.Listen(c); err != nil {
			select {
			case <-stop:
				return nil
			default:
				return fmt.Errorf("meta: listen %s: %w", c, err)
			}
		}
	}
	listening := func() {
		if h.Listening != nil {
			h.Listening()
		}
	}
	listening()
	ping := time.NewTicker(listenPing)
	defer ping.Stop()
	for {
		select {
		case <-stop:
			return nil
		case n, ok := <-l.Notify:
			switch {
			case !ok:
				return nil
			case n == nil: // re-established: announcements were lost meanwhile
				listening()
			case h.Notify != nil:
				h.Notify(n.Channel, n.Extra)
			}
		case <-ping.C:
			go func() { _ = l.Ping() }()
		}
	}
}

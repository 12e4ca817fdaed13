package live

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/lib/pq"

	"devicehub/meta"
)

// PGBus is a Bus over PostgreSQL's LISTEN/NOTIFY in the database the
// instances share: no other service to run, and only the instances of
// one deployment (one database) hear each other. A notification is
// delivered at its transaction's commit to every session listening on
// its channel then; PostgreSQL refuses payloads of 8000 bytes or more.
type PGBus struct {
	dsn string
	db  *sql.DB
}

// NewPGBus opens the bus on the database of dsn (lib/pq form, as
// meta.Options.DSN). It holds one connection to send and, per Listen, one
// to listen.
func NewPGBus(dsn string) (*PGBus, error) {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return nil, fmt.Errorf("live: bus: %w", err)
	}
	db.SetMaxOpenConns(1) // the forwarder and the announcer send in turn
	db.SetMaxIdleConns(1)
	return &PGBus{dsn: dsn, db: db}, nil
}

// MaxPayload is below PostgreSQL's limit of 8000 bytes.
func (b *PGBus) MaxPayload() int { return 7900 }

// Send notifies channel of each payload, in one statement (one
// transaction): unnest yields them in order, and PostgreSQL delivers a
// transaction's notifications in the order they were made.
func (b *PGBus) Send(ctx context.Context, channel string, payloads []string) error {
	if len(payloads) == 0 {
		return nil
	}
	if _, err := b.db.ExecContext(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`,
		channel, pq.StringArray(payloads)); err != nil {
		return fmt.Errorf("live: bus send: %w", err)
	}
	return nil
}

// Listen listens on its own connection (meta.Listen), which is
// re-established after a loss (then reconnected runs). It returns once
// PostgreSQL has acknowledged every LISTEN, or with ctx's error.
func (b *PGBus) Listen(ctx context.Context, channels []string, h func(channel, payload string), reconnected func()) (func(), error) {
	stop, listened, errc := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	first := true
	go func() {
		errc <- meta.Listen(b.dsn, channels, meta.ListenHandler{
			Notify: h,
			Listening: func() {
				if first {
					first = false
					close(listened)
					return
				}
				reconnected()
			},
		}, stop)
	}()
	select {
	case <-listened:
	case err := <-errc:
		if err == nil { // stopped before it listened: lib/pq closed the listener
			err = errors.New("listener closed")
		}
		return nil, fmt.Errorf("live: bus listen: %w", err)
	case <-ctx.Done():
		close(stop)
		<-errc
		return nil, fmt.Errorf("live: bus listen: %w", ctx.Err())
	}
	return sync.OnceFunc(func() {
		close(stop)
		<-errc
	}), nil
}

// Close closes the sending connection; stop each Listen first.
func (b *PGBus) Close() error { return b.db.Close() }

package live

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/lib/pq"
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

// Listen listens on its own connection, which lib/pq re-establishes
// after a loss (then reconnected runs). It returns once PostgreSQL has
// acknowledged every LISTEN, or with ctx's error.
func (b *PGBus) Listen(ctx context.Context, channels []string, h func(channel, payload string), reconnected func()) (func(), error) {
	l := pq.NewListener(b.dsn, 100*time.Millisecond, 5*time.Second, nil)
	listened := make(chan error, 1)
	go func() {
		for _, c := range channels {
			if err := l.Listen(c); err != nil {
				listened <- err
				return
			}
		}
		listened <- nil
	}()
	select {
	case err := <-listened:
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("live: bus listen: %w", err)
		}
	case <-ctx.Done():
		l.Close() // Listen returns once the listener is closed
		<-listened
		return nil, fmt.Errorf("live: bus listen: %w", ctx.Err())
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ping := time.NewTicker(30 * time.Second)
		defer ping.Stop()
		for {
			select {
			case <-stop:
				return
			case n, ok := <-l.Notify:
				switch {
				case !ok:
					return
				case n == nil: // the connection was re-established
					reconnected()
				default:
					h(n.Channel, n.Extra)
				}
			case <-ping.C:
				// A dead connection is noticed, and re-established, only
				// when used.
				go func() { _ = l.Ping() }()
			}
		}
	}()
	return sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
		l.Close()
	}), nil
}

// Close closes the sending connection; stop each Listen first.
func (b *PGBus) Close() error { return b.db.Close() }

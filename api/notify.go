package api

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/ingest/notify"
	"devicehub/meta"
	"devicehub/schema"
)

// Notifications (ingest/notify): channels, subscriptions and dead
// letters under /api/notify, all needing notify:admin. Channels are the
// installation's (a URL, a mailbox, a broker): changed only by a caller
// holding notify:admin on every product; one limited to products lists
// and tests them. A subscription names products, all of which the caller
// must hold notify:admin on; a limited caller sees, changes and deletes
// only subscriptions wholly within its products, and the dead letters of
// its products' alarms. Every write is audited (the /api group's
// audited).

// NotifyStore is what the notification routes need; *notify.Store is one.
type NotifyStore interface {
	Channel(ctx context.Context, id string) (notify.Channel, error)
	Channels(ctx context.Context) ([]notify.Channel, error)
	SaveChannel(ctx context.Context, c notify.Channel, by string, create bool) (notify.Channel, error)
	DeleteChannel(ctx context.Context, id string) error
	Subscription(ctx context.Context, id string, products []string) (notify.Subscription, error)
	Subscriptions(ctx context.Context, products []string) ([]notify.Subscription, error)
	SaveSubscription(ctx context.Context, s notify.Subscription, by string, create bool, products []string) (notify.Subscription, error)
	DeleteSubscription(ctx context.Context, id string, products []string) error
	DeadLetters(ctx context.Context, q notify.DeadQuery) ([]notify.Dead, int, error)
	Replay(ctx context.Context, id int64, products []string) error
}

var errNoNotify = errors.New("api: notifications are not configured")

func (s *Server) notifyStore() (NotifyStore, error) {
	if s.deps.Notify == nil {
		return nil, errNoNotify
	}
	return s.deps.Notify, nil
}

// notifyScope is the caller's products for notify:admin: nil on every
// product.
func notifyScope(c *fiber.Ctx) []string {
	all, products := meta.ProductsOf(c.UserContext())
	if all {
		return nil
	}
	if products == nil {
		products = []string{}
	}
	return products
}

// channelRefused refuses (accessDeniedError) a caller limited to
// products: channels are the installation's.
func channelRefused(c *fiber.Ctx) (bool, error) {
	if notifyScope(c) == nil {
		return false, nil
	}
	return true, accessDeniedError("access denied: channels are the installation's; this needs permission notify:admin on every product")
}

// notifyList is the result of the notification _query routes: every
// item, in order (channels and subscriptions are few; dead letters a page).
type notifyList[T any] struct {
	Total int `json:"total"`
	Data  []T `json:"data"`
}

func publicChannels(cs []notify.Channel) []notify.Channel {
	out := make([]notify.Channel, len(cs))
	for i, c := range cs {
		out[i] = c.Public()
	}
	return out
}

// createChannel is POST /api/notify/channel.
func (s *Server) createChannel(c *fiber.Ctx) error { return s.saveChannel(c, true) }

// updateChannel is PUT /api/notify/channel/{id}: the whole channel; an
// empty secret keeps the stored one.
func (s *Server) updateChannel(c *fiber.Ctx) error { return s.saveChannel(c, false) }

func (s *Server) saveChannel(c *fiber.Ctx, create bool) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	if refused, err := channelRefused(c); refused {
		return err
	}
	var ch notify.Channel
	if err := decodeJSON(c, &ch); err != nil {
		return err
	}
	if !create {
		ch.ID = c.Params("id")
	}
	saved, err := store.SaveChannel(c.UserContext(), ch, currentUser(c).ID, create)
	if err != nil {
		return err
	}
	return ok(c, saved.Public())
}

// deleteChannel is DELETE /api/notify/channel/{id}; a channel a
// subscription names is 409 conflict.
func (s *Server) deleteChannel(c *fiber.Ctx) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	if refused, err := channelRefused(c); refused {
		return err
	}
	if err := store.DeleteChannel(c.UserContext(), c.Params("id")); err != nil {
		return err
	}
	return ok(c, c.Params("id"))
}

// queryChannels is POST /api/notify/channel/_query: every channel, by
// name, without secrets.
func (s *Server) queryChannels(c *fiber.Ctx) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	cs, err := store.Channels(c.UserContext())
	if err != nil {
		return err
	}
	return ok(c, notifyList[notify.Channel]{Total: len(cs), Data: publicChannels(cs)})
}

// channelTest is what _test answers: whether the other side accepted a
// test message and what it said.
type channelTest struct {
	Delivered bool   `json:"delivered"`
	Status    int    `json:"status,omitempty"`
	Answer    string `json:"answer,omitempty"`
	Error     string `json:"error,omitempty"`
	Key       string `json:"idempotencyKey"`
	Millis    int64  `json:"millis"`
}

// testChannel is POST /api/notify/channel/{id}/_test: sends a test
// message over the channel now and answers what the other side said (a
// refusal is a 200 with delivered false: the test itself worked).
func (s *Server) testChannel(c *fiber.Ctx) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	ch, err := store.Channel(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	n := notify.SampleNotification()
	start := time.Now()
	res, err := notify.Send(c.UserContext(), ch, n)
	out := channelTest{Delivered: err == nil, Status: res.Status, Answer: res.Body, Key: n.IdempotencyKey, Millis: time.Since(start).Milliseconds()}
	if err != nil {
		out.Error = safeText(err.Error())
	}
	return ok(c, out)
}

// createSubscription is POST /api/notify/subscription.
func (s *Server) createSubscription(c *fiber.Ctx) error { return s.saveSubscription(c, true) }

// updateSubscription is PUT /api/notify/subscription/{id}: the whole
// subscription.
func (s *Server) updateSubscription(c *fiber.Ctx) error { return s.saveSubscription(c, false) }

func (s *Server) saveSubscription(c *fiber.Ctx, create bool) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	sub := notify.Subscription{Enabled: true} // absent: enabled
	if err := decodeJSON(c, &sub); err != nil {
		return err
	}
	if !create {
		sub.ID = c.Params("id")
	}
	scope := notifyScope(c)
	if scope != nil {
		for i, p := range sub.Products {
			if !containsString(scope, p) {
				return schema.Invalid(fmt.Sprintf("products[%d]", i), "no product %q among the caller's", schema.Truncate(p, 80))
			}
		}
	}
	saved, err := store.SaveSubscription(c.UserContext(), sub, currentUser(c).ID, create, scope)
	if err != nil {
		return err
	}
	return ok(c, saved)
}

func containsString(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// deleteSubscription is DELETE /api/notify/subscription/{id}.
func (s *Server) deleteSubscription(c *fiber.Ctx) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	if err := store.DeleteSubscription(c.UserContext(), c.Params("id"), notifyScope(c)); err != nil {
		return err
	}
	return ok(c, c.Params("id"))
}

// querySubscriptions is POST /api/notify/subscription/_query: the
// subscriptions within the caller's products, by name.
func (s *Server) querySubscriptions(c *fiber.Ctx) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	subs, err := store.Subscriptions(c.UserContext(), notifyScope(c))
	if err != nil {
		return err
	}
	return ok(c, notifyList[notify.Subscription]{Total: len(subs), Data: subs})
}

// deadQuery is the body of POST /api/notify/dead/_query (optional).
type deadQuery struct {
	ChannelID      string `json:"channelId"`
	SubscriptionID string `json:"subscriptionId"`
	PageIndex      int    `json:"pageIndex"`
	PageSize       int    `json:"pageSize"`
}

// queryDead is POST /api/notify/dead/_query: dead letters of the caller's
// products' alarms, the latest first.
func (s *Server) queryDead(c *fiber.Ctx) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	var q deadQuery
	if len(c.Body()) > 0 {
		if err := decodeJSON(c, &q); err != nil {
			return err
		}
	}
	if q.PageSize == 0 {
		q.PageSize = 100
	}
	if q.PageIndex < 0 || q.PageSize < 1 || q.PageSize > 1000 || q.PageIndex > 1_000_000 {
		return schema.Invalid("pageIndex, pageSize", "at least 0 and 1 to 1000")
	}
	dead, total, err := store.DeadLetters(c.UserContext(), notify.DeadQuery{ChannelID: q.ChannelID, SubscriptionID: q.SubscriptionID,
		Products: notifyScope(c), Limit: q.PageSize, Offset: q.PageIndex * q.PageSize})
	if err != nil {
		return err
	}
	if dead == nil {
		dead = []notify.Dead{}
	}
	return ok(c, notifyList[notify.Dead]{Total: total, Data: dead})
}

// replayDead is POST /api/notify/dead/{id}/_replay: the dead letter is
// pending again, due now, with its idempotency key.
func (s *Server) replayDead(c *fiber.Ctx) error {
	store, err := s.notifyStore()
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(c.Params("id"), 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("dead letter %q: %w", schema.Truncate(c.Params("id"), 80), meta.ErrNotFound)
	}
	if err := store.Replay(c.UserContext(), id, notifyScope(c)); err != nil {
		return err
	}
	return ok(c, id)
}

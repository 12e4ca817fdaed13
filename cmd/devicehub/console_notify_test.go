package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
)

// TestConsoleNotifyInBrowser drives the Notifications pages in headless
// chromium against the real binary and a real HTTP receiver: a webhook
// channel is refused for its URL (the message beside the URL), then made;
// its Test shows what the receiver answered (a 404 and its body); a
// subscription sends the product's alarms to it. An alarm's notification,
// answered 404 with one attempt allowed, becomes a dead letter, listed
// with its error; once the receiver answers 200, Replay delivers it with
// its idempotency key. The channel is edited, refused deletion while the
// subscription names it (the server's 409 shown), and deleted after it.
// At 420 px the pages fit; an operator (no notify:admin) has none of them.
func TestConsoleNotifyInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	var status atomic.Int32
	status.Store(http.StatusNotFound)
	type hit struct{ key, body string }
	var mu sync.Mutex
	var hits []hit
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hits = append(hits, hit{key: r.Header.Get("Idempotency-Key"), body: string(b)})
		mu.Unlock()
		st := int(status.Load())
		w.WriteHeader(st)
		fmt.Fprintf(w, "receiver says %d", st)
	}))
	defer rcv.Close()
	received := func() []hit { mu.Lock(); defer mu.Unlock(); return append([]hit(nil), hits...) }

	own := startOwn(t, "consolenotify", "DEVICEHUB_NOTIFY_MAX_ATTEMPTS=1")
	srv, suffix, token := own.server, own.suffix, own.token
	product, dev := "cn"+suffix, "pump-"+suffix
	own.productWithDevice(t, product, "Pumps "+suffix, alarmTestModel, dev, "Pump", true)
	own.hotRule(t, "hot-"+suffix, "Pump too hot", product)

	b := newBrowser(t, chromium)
	signIn(b, srv.base, "admin", "admin123", chromedp.WaitVisible(chromedp.ID("nav-notify")))
	b.run("open the notifications", chromedp.Click(chromedp.ID("nav-notify")), chromedp.WaitVisible(chromedp.ID("channel-new")))
	b.poll("no channel yet", `document.getElementById('channels-list').textContent.includes('No channel yet.')`)

	// A channel: refused for its URL, then made.
	b.run("new channel", chromedp.Click(chromedp.ID("channel-new")), chromedp.WaitVisible(chromedp.ID("channel-url")))
	b.run("a URL that is none", fill("#channel-id", "hook"), fill("#channel-name", "On-call hook"), fill("#channel-url", "ftp://nowhere"),
		fill("#channel-headers", "X-Team: pumps"), chromedp.Click(chromedp.ID("channel-save")))
	b.poll("the refusal beside the URL", `(() => {
		const e = document.getElementById('channel-url').nextElementSibling;
		return !!e && e.classList.contains('field-error') && e.dataset.for === 'webhook.url';
	})()`)
	b.run("a real URL", fill("#channel-url", rcv.URL), chromedp.Click(chromedp.ID("channel-save")))
	b.poll("the channel listed", `!!document.querySelector('tr[data-channel=hook]') && !document.getElementById('channel-form')`)
	var ch struct {
		Data []struct {
			ID      string `json:"id"`
			Name    string `json:"name"`
			Webhook struct {
				URL     string            `json:"url"`
				Headers map[string]string `json:"headers"`
			} `json:"webhook"`
		} `json:"data"`
	}
	srv.do(t, token, "POST", "/api/notify/channel/_query", map[string]any{}, &ch)
	if len(ch.Data) != 1 || ch.Data[0].ID != "hook" || ch.Data[0].Webhook.URL != rcv.URL || ch.Data[0].Webhook.Headers["X-Team"] != "pumps" {
		t.Fatalf("channels after the form: %+v", ch.Data)
	}

	// Test: the receiver's answer shown.
	b.run("test the channel", chromedp.Click(chromedp.CSS(`button[data-action=test][data-channel=hook]`)))
	b.poll("the receiver's answer", `(() => {
		const e = document.querySelector('.channel-test[data-channel=hook]');
		return e.dataset.delivered === 'false' && e.querySelector('.test-summary').textContent.includes('status 404') &&
			e.querySelector('.test-answer').textContent === 'receiver says 404';
	})()`)
	if n := len(received()); n != 1 {
		t.Fatalf("the receiver got %d requests from the test, want 1", n)
	}

	// A subscription: the product's alarms, raised, to the hook.
	b.run("the subscriptions", chromedp.Click(chromedp.CSS(`nav.tabs a[data-tab=subscriptions]`)), chromedp.WaitVisible(chromedp.ID("subscription-new")))
	b.run("new subscription", chromedp.Click(chromedp.ID("subscription-new")), chromedp.WaitVisible(chromedp.ID("subscription-name")))
	b.run("fill it", fill("#subscription-name", "On call"), fill("#subscription-quiet", "10m"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#subscription-products input[value=%q]`, product))),
		chromedp.Click(chromedp.ID("subscription-save")))
	b.poll("the subscription listed", `(document.querySelector('#subscriptions-list tr[data-subscription] .sub-chain') || {}).textContent === 'On-call hook'`)
	var subs struct {
		Data []struct {
			Products []string `json:"products"`
			Channels []string `json:"channels"`
			Kinds    []string `json:"kinds"`
			QuietMs  int64    `json:"quietMs"`
		} `json:"data"`
	}
	srv.do(t, token, "POST", "/api/notify/subscription/_query", map[string]any{}, &subs)
	if len(subs.Data) != 1 || fmt.Sprint(subs.Data[0].Products, subs.Data[0].Channels, subs.Data[0].Kinds, subs.Data[0].QuietMs) != fmt.Sprintf("[%s] [hook] [raised] 600000", product) {
		t.Fatalf("subscriptions after the form: %+v", subs.Data)
	}

	// An alarm: its notification answered 404 once is a dead letter.
	pub := gateway(t, own.broker.URL(), "gw-"+suffix)
	n := 0
	testkit.Eventually(t, 30*time.Second, "a dead letter", func() bool {
		n++
		_ = mqttconn.WaitToken(pub.Publish("/"+product+"/"+dev+"/properties/report", 1, false, fmt.Sprintf(`{"messageId":"m%d","properties":{"temp":95}}`, n)), 5*time.Second)
		var dead struct {
			Total int `json:"total"`
		}
		srv.do(t, token, "POST", "/api/notify/dead/_query", map[string]any{}, &dead)
		return dead.Total == 1
	})
	failed := received()[1:]
	if len(failed) != 1 || failed[0].key == "" {
		t.Fatalf("the receiver got %d notifications before the dead letter, want 1 with a key: %+v", len(failed), failed)
	}
	b.run("the dead letters", chromedp.Click(chromedp.CSS(`nav.tabs a[data-tab=dead]`)), chromedp.WaitVisible(chromedp.CSS(`button[data-action=replay]`)))
	b.poll("its error and alarm", `document.querySelectorAll('#dead-list tr[data-dead]').length === 1 &&
		document.querySelector('.dead-error').textContent.includes('404') && document.getElementById('dead-list').textContent.includes('Pump too hot')`)
	b.shot("notify-dead")
	status.Store(http.StatusOK)
	b.run("replay", chromedp.Click(chromedp.CSS(`button[data-action=replay]`)))
	b.poll("replayed", `document.getElementById('dead-note').textContent.includes('replayed') && document.getElementById('dead-list').textContent.includes('No dead letter.')`)
	testkit.Eventually(t, 15*time.Second, "the replayed notification delivered", func() bool { return len(received()) == 3 })
	if got := received()[2]; got.key != failed[0].key || got.body != failed[0].body {
		t.Fatalf("the replay came with key %q, want the dead letter's %q (and its body)", got.key, failed[0].key)
	}

	// 420 px: each page fits.
	narrowFits(b, "dead letters", "#/notify/dead", `#dead-list .empty`)
	narrowFits(b, "subscriptions", "#/notify/subscriptions", `#subscriptions-list tr[data-subscription]`)
	narrowFits(b, "channels", "#/notify", `tr[data-channel=hook]`)

	// Edit the channel; delete it: refused while subscribed, then done.
	b.run("edit the channel", chromedp.Click(chromedp.CSS(`button[data-action=edit][data-channel=hook]`)), chromedp.WaitVisible(chromedp.ID("channel-name")))
	b.run("rename it", fill("#channel-name", "Pager hook"), chromedp.Click(chromedp.ID("channel-save")))
	b.poll("renamed", `document.querySelector('tr[data-channel=hook] .strong').textContent === 'Pager hook'`)
	srv.do(t, token, "POST", "/api/notify/channel/_query", map[string]any{}, &ch)
	if len(ch.Data) != 1 || ch.Data[0].Name != "Pager hook" || ch.Data[0].Webhook.URL != rcv.URL {
		t.Fatalf("channel after the edit: %+v", ch.Data)
	}
	b.run("delete it", chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`), chromedp.Click(chromedp.CSS(`button[data-action=delete][data-channel=hook]`)))
	b.poll("refused: subscribed", `document.getElementById('channels-note').className === 'error' && document.getElementById('channels-note').textContent.includes('409')`)
	b.run("the subscriptions", chromedp.Click(chromedp.CSS(`nav.tabs a[data-tab=subscriptions]`)), chromedp.WaitVisible(chromedp.CSS(`button[data-action=delete][data-subscription]`)))
	b.run("delete the subscription", chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`), chromedp.Click(chromedp.CSS(`button[data-action=delete][data-subscription]`)))
	b.poll("no subscription", `document.getElementById('subscriptions-list').textContent.includes('No subscription yet.')`)
	b.run("the channels", chromedp.Click(chromedp.CSS(`nav.tabs a[data-tab=channels]`)), chromedp.WaitVisible(chromedp.CSS(`button[data-action=delete][data-channel=hook]`)))
	b.run("delete the channel", chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`), chromedp.Click(chromedp.CSS(`button[data-action=delete][data-channel=hook]`)))
	b.poll("no channel", `document.getElementById('channels-list').textContent.includes('No channel yet.')`)
	srv.do(t, token, "POST", "/api/notify/channel/_query", map[string]any{}, &ch)
	if len(ch.Data) != 0 {
		t.Fatalf("channels after the delete: %+v", ch.Data)
	}
	b.checkExceptions()

	// An operator holds no notify:admin: no Notifications page.
	srv.call(t, token, "POST", "/api/user", map[string]any{"username": "op" + suffix, "password": "operator-pass", "roles": []string{"operator"}})
	b.run("sign out", chromedp.Click(chromedp.ID("logout")))
	signIn(b, "", "op"+suffix, "operator-pass", chromedp.WaitVisible(chromedp.ID("nav-alarms")))
	b.run("go to #/notify", goTo("#/notify"))
	b.poll("no notifications page", `document.getElementById('nav-notify').hidden && document.getElementById('view').textContent.includes('There is no page here.')`)
	b.checkExceptions()
}

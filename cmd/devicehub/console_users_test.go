package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/testkit"
)

// TestConsoleUsersInBrowser drives the console's Users, Audit and account
// pages in headless chromium against the real binary: an administrator
// creates a user with a role, changes its roles, disables and enables it,
// resets its password and finds these writes in the audit trail; that
// user, signed in, sees neither the Users nor the Audit page (nor their
// routes), sees its roles, and changes its own password: a wrong current
// one shows the API's refusal, the right one works, and the new password
// signs in; it makes an API key, whose secret is shown once and works,
// and revokes it: the key is refused within 1 s.
func TestConsoleUsersInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	own := startOwn(t, "consoleusers")
	srv, suffix, token := own.server, own.suffix, own.token
	user := "ann" + suffix
	row := func(action string) string { // a button of the user's row
		return fmt.Sprintf(`button[data-action=%s][data-user=%q]`, action, user)
	}
	rolesOf := func() string {
		var page struct {
			Data []struct {
				Roles []string `json:"roles"`
			} `json:"data"`
		}
		srv.do(t, token, "POST", "/api/user/_query", map[string]any{"terms": []map[string]any{{"column": "username", "value": user}}}, &page)
		if len(page.Data) != 1 {
			t.Fatalf("user %s: %+v", user, page)
		}
		return strings.Join(page.Data[0].Roles, ",")
	}
	b := newBrowser(t, chromium)
	in := func(what, name, password string, then chromedp.Action[chromedp.Void]) {
		t.Helper()
		b.run(what,
			chromedp.WaitVisible(chromedp.ID("login-form")),
			chromedp.Evaluate[chromedp.Void](`document.getElementById('login-user').value = ''; document.getElementById('login-password').value = ''`),
			chromedp.SendKeys(chromedp.ID("login-user"), name),
			chromedp.SendKeys(chromedp.ID("login-password"), password),
			chromedp.Click(chromedp.ID("login-submit")),
			then)
	}
	b.run("open the console", chromedp.Navigate(srv.base+"/"))
	in("sign in as admin", "admin", "admin123", chromedp.WaitVisible(chromedp.ID("nav-users")))

	// Create a user with a role; the roles offered are the server's.
	b.run("open the users", chromedp.Click(chromedp.ID("nav-users")), chromedp.WaitVisible(chromedp.ID("new-user")))
	b.poll("the roles to choose from", `[...document.querySelectorAll('#new-user-role option')].map((o) => o.value).sort().join() === 'admin,operator,viewer'`)
	b.run("create a user",
		chromedp.SendKeys(chromedp.ID("new-user-username"), user),
		chromedp.SendKeys(chromedp.ID("new-user-password"), "first-password"),
		setSelect("#new-user-role", "operator"),
		chromedp.Click(chromedp.ID("new-user-submit")))
	b.poll("the new user with its role", fmt.Sprintf(`(document.querySelector('.user-roles[data-user=%q]') || {}).textContent === 'Operator'`, user))
	if r := rolesOf(); r != "operator" {
		t.Fatalf("created with roles %q, want operator", r)
	}

	// Its roles: viewer instead of operator.
	b.run("edit its roles", chromedp.Click(chromedp.CSS(row("roles"))), chromedp.WaitVisible(chromedp.CSS(`.roles-form input[data-role=viewer]`)))
	b.run("choose viewer only",
		chromedp.Click(chromedp.CSS(`.roles-form input[data-role=operator]`)),
		chromedp.Click(chromedp.CSS(`.roles-form input[data-role=viewer]`)),
		chromedp.Click(chromedp.CSS(`.roles-form button[data-action=save-roles]`)))
	b.poll("the roles saved", fmt.Sprintf(`(document.querySelector('.user-roles[data-user=%q]') || {}).textContent === 'Viewer'`, user))
	if r := rolesOf(); r != "viewer" {
		t.Fatalf("roles %q after the change, want viewer", r)
	}

	// Disable, enable, reset the password (the console asks with prompt).
	b.run("disable", chromedp.Click(chromedp.CSS(row("disable"))))
	b.poll("disabled", fmt.Sprintf(`!!document.querySelector(%q)`, row("enable")))
	b.run("enable", chromedp.Click(chromedp.CSS(row("enable"))))
	b.poll("enabled", fmt.Sprintf(`!!document.querySelector(%q)`, row("disable")))
	b.run("reset its password",
		chromedp.Evaluate[chromedp.Void](`window.prompt = () => 'reset-password'`),
		chromedp.Click(chromedp.CSS(row("password"))))
	b.poll("the reset confirmed", `document.getElementById('users-note').textContent.includes('reset')`)
	b.shot("users")

	// The audit trail shows these writes, once stored (within a second).
	testkit.Eventually(t, 10*time.Second, "the user's changes audited", func() bool {
		var page struct {
			Total int `json:"total"`
		}
		srv.do(t, token, "POST", "/api/audit/_query", map[string]any{"terms": []map[string]any{{"column": "route", "termType": "like", "value": "/api/user/:id%"}}}, &page)
		return page.Total == 4
	})

	b.run("open the audit trail", chromedp.Click(chromedp.ID("nav-audit")), chromedp.WaitVisible(chromedp.ID("audit-search")))
	b.poll("the user's changes audited", `[...document.querySelectorAll('.audit-route')].filter((e) => e.textContent === 'PUT /api/user/:id').length === 3 &&
		[...document.querySelectorAll('.audit-route')].some((e) => e.textContent === 'PUT /api/user/:id/password')`)
	b.shot("audit")
	b.run("sign out", chromedp.Click(chromedp.ID("logout")))

	// The user: no Users or Audit page; its own password.
	in("sign in as the user", user, "reset-password", chromedp.WaitVisible(chromedp.ID("whoami")))
	b.poll("no admin pages in the menu", `document.getElementById('nav-users').hidden && document.getElementById('nav-audit').hidden`)
	for _, page := range []string{"users", "audit"} {
		b.run("go to #/"+page, chromedp.Evaluate[chromedp.Void](`location.hash = '#/`+page+`'`))
		b.poll("no "+page+" page", `document.getElementById('view').textContent.includes('There is no page here.')`)
	}
	b.run("open the account", chromedp.Click(chromedp.ID("whoami")), chromedp.WaitVisible(chromedp.ID("password-form")))
	if r := b.text("#account-roles"); r != "viewer" {
		t.Fatalf("account roles %q, want viewer", r)
	}
	if p := b.text("#account-permissions"); strings.Contains(p, "user:admin") || !strings.Contains(p, "device:read") {
		t.Fatalf("account permissions %q", p)
	}
	change := func(old, pw string) {
		b.run("change the password",
			chromedp.Evaluate[chromedp.Void](`document.getElementById('password-form').reset(); document.getElementById('password-note').textContent = ''`),
			chromedp.SendKeys(chromedp.ID("password-old"), old),
			chromedp.SendKeys(chromedp.ID("password-new"), pw),
			chromedp.SendKeys(chromedp.ID("password-again"), pw),
			chromedp.Click(chromedp.ID("password-submit")))
	}
	change("not-the-password", "second-password")
	b.poll("the refusal", `document.getElementById('password-note').className === 'error' && document.getElementById('password-note').textContent.includes('oldPassword')`)
	change("reset-password", "second-password")
	b.poll("the change", `document.getElementById('password-note').textContent.includes('Password changed')`)
	b.shot("account")

	// An API key: made with one of the user's permissions, its secret
	// shown once, it works; revoked, it is refused.
	b.run("create a key",
		chromedp.WaitVisible(chromedp.ID("new-key")),
		chromedp.SendKeys(chromedp.ID("new-key-name"), "script"),
		chromedp.Click(chromedp.CSS(`#new-key input[data-permission="device:read"]`)),
		chromedp.Click(chromedp.ID("new-key-submit")))
	b.poll("the key's secret and row", `!!document.getElementById('key-secret-value') && !!document.querySelector('#keys-list tr[data-key=script]')`)
	secret := b.text("#key-secret-value")
	if !strings.HasPrefix(secret, "dhk_") || strings.Contains(b.text("#keys-list"), secret) {
		t.Fatalf("key secret %q (it must not be in the list: %q)", secret, b.text("#keys-list"))
	}
	keyStatus := func() int {
		return srv.doStatus(t, secret, "POST", "/api/device-instance/_query", "{}")
	}
	if s := keyStatus(); s != 200 {
		t.Fatalf("the console's key lists devices: %d", s)
	}
	b.shot("keys")
	b.run("revoke the key",
		chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`),
		chromedp.Click(chromedp.CSS(`button[data-action=revoke][data-key=script]`)))
	b.poll("the key gone from the list", `!document.querySelector('#keys-list tr[data-key=script]')`)
	testkit.Eventually(t, time.Second, "the revoked key refused", func() bool { return keyStatus() == 401 })
	b.run("sign out again", chromedp.Click(chromedp.ID("logout")))
	in("sign in with the new password", user, "second-password", chromedp.WaitVisible(chromedp.ID("whoami")))
	b.checkExceptions()
}

package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"
)

// ruleModel has a number, an enum and an event with a field, so that the
// editor's choices come from a thing model.
const ruleModel = `{"properties":[` +
	`{"id":"temp","name":"Temperature","valueType":{"type":"float"}},` +
	`{"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"eco","text":"Eco"},{"value":"boost","text":"Boost"}]}}],` +
	`"events":[{"id":"fault","name":"Fault","valueType":{"type":"object","properties":[{"id":"code","name":"Code","valueType":{"type":"int"}}]}}],` +
	`"functions":[],"tags":[]}`

// TestConsoleAlarmRulesInBrowser drives the Alarms page's rule editor in
// headless chromium against the real binary: an administrator opens a
// product's rules from the Alarms page, makes a rule with the form (temp
// > each device's config.maxTemp, 80 without one, held for 30 s, cleared
// below 78), which the server first refuses for a threshold that is not
// a number: its message stands beside that threshold's input; fixed,
// the rule is stored as the form said. A severity ladder typed into the
// JSON shows in the form and is stored;
// the list disables, enables and deletes the rule. At 420 px neither page
// is wider than the window. A viewer (alarm:read, no rule:write) sees the
// rules and the editor without a button that writes.
func TestConsoleAlarmRulesInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	own := startOwn(t, "consolerules")
	srv, suffix, token := own.server, own.suffix, own.token
	product, ruleID := "ar"+suffix, "hot-"+suffix
	srv.call(t, token, "POST", "/api/device/product", map[string]any{"id": product, "name": "Rules " + suffix, "classifiedId": "test",
		"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device", "metadata": ruleModel})
	getRule := func() (int, map[string]any) {
		res, err := srv.api(token).Request("GET", "/api/alarm/config/"+ruleID, nil)
		if err != nil {
			t.Fatal(err)
		}
		var r map[string]any
		_ = json.Unmarshal(res.Result, &r)
		return res.HTTPStatus, r
	}
	asJSON := func(v any) string { b, _ := json.Marshal(v); return string(b) } // maps: keys sorted

	b := newBrowser(t, chromium)
	signIn(b, srv.base, "admin", "admin123", chromedp.WaitVisible(chromedp.ID("nav-alarms")))
	b.run("open the alarms", chromedp.Click(chromedp.ID("nav-alarms")), chromedp.WaitVisible(chromedp.ID("alarm-rules-link")))
	b.run("open the rules", chromedp.Click(chromedp.ID("alarm-rules-link")), chromedp.WaitVisible(chromedp.ID("rule-product")))
	b.poll("the product offered", fmt.Sprintf(`!!document.querySelector('#rule-product option[value=%q]')`, product))
	b.run("choose the product", fill("#rule-product", product))
	b.poll("no rule yet", `document.getElementById('rules-list').textContent.includes('no alarm rule')`)
	b.run("new rule", chromedp.Click(chromedp.ID("rule-new")), chromedp.WaitVisible(chromedp.ID("rule-id")))
	b.poll("the model's properties offered", `!!document.querySelector('#rule-trigger-type')`)
	b.run("fill the form",
		fill("#rule-id", ruleID),
		fill("#rule-name", "Boiler too hot"),
		fill("#rule-severity", "minor"),
		chromedp.Click(chromedp.CSS(`fieldset[data-field=trigger] .rule-cond-add`)))
	b.poll("a condition row", `!!document.querySelector('[data-field="trigger.all[0].value"]')`)
	b.run("temp > hot, held for 30 s",
		fill(`[data-field="trigger.all[0].property"]`, "temp"),
		fill(`[data-field="trigger.all[0].op"]`, "gt"),
		fill(`[data-field="trigger.all[0].value"]`, "hot"),
		fill("#rule-raise", "held"))
	b.poll("the duration's input", `!!document.querySelector('input[data-field="duration"]')`)
	b.run("30 s; cleared on its own condition", fill(`input[data-field="duration"]`, "30s"), fill("#rule-clear-type", "condition"))
	b.poll("the clear's conditions", `!!document.querySelector('fieldset[data-field=clear] .rule-cond-add')`)
	b.run("temp < 78 clears", chromedp.Click(chromedp.CSS(`fieldset[data-field=clear] .rule-cond-add`)))
	b.poll("the clear's row", `!!document.querySelector('[data-field="clear.all[0].value"]')`)
	b.run("fill the clear",
		fill(`[data-field="clear.all[0].property"]`, "temp"),
		fill(`[data-field="clear.all[0].op"]`, "lt"),
		fill(`[data-field="clear.all[0].value"]`, "78"))
	b.poll("the JSON follows the form", `JSON.parse(document.getElementById('rule-json').value).clear.all[0].value === 78`)

	// The server refuses the threshold "hot": its message beside that input.
	b.run("save", chromedp.Click(chromedp.ID("rule-save")))
	b.poll("the refusal beside the threshold", `(() => {
		const e = document.querySelector('[data-field="trigger.all[0].value"]').nextElementSibling;
		return !!e && e.classList.contains('field-error') && e.dataset.for === 'trigger.all[0].value' && e.textContent.includes('illegal_argument');
	})()`)
	if n := evalJS[int](b, `document.querySelectorAll('.field-error').length`); n != 1 {
		t.Fatalf("%d error messages shown, want 1", n)
	}
	if status, _ := getRule(); status != 404 {
		t.Fatalf("the refused rule answers %d, want 404", status)
	}
	b.shot("rule-refused")
	b.run("fix the threshold: each device's maxTemp, 80 without", fill(`[data-field="trigger.all[0].value"]`, "80"),
		fill(`[data-field="trigger.all[0].ref"]`, "config.maxTemp"), chromedp.Click(chromedp.ID("rule-save")))
	b.poll("saved, on its own page", fmt.Sprintf(`location.hash === '#/alarm-rule/%s' && !!document.querySelector('#rule-id[disabled]')`, ruleID))
	status, r := getRule()
	if status != 200 {
		t.Fatalf("the rule answers %d", status)
	}
	if got, want := asJSON([]any{r["name"], r["severity"], r["enabled"], r["trigger"], r["duration"], r["clear"]}),
		`["Boiler too hot","minor",true,{"all":[{"op":"gt","property":"temp","ref":"config.maxTemp","value":80}],"type":"property"},"30s",{"all":[{"op":"lt","property":"temp","value":78}],"type":"condition"}]`; got != want {
		t.Fatalf("stored rule\n%s\nwant\n%s", got, want)
	}

	// A ladder typed into the JSON: the form shows it, the server stores it.
	b.run("a ladder in the JSON", chromedp.Evaluate[chromedp.Void](`(() => {
		const ta = document.getElementById('rule-json');
		const r = JSON.parse(ta.value);
		r.ladder = [{ severity: 'critical', all: [{ property: 'temp', op: 'gt', value: 95 }] }];
		ta.value = JSON.stringify(r, null, 2);
		ta.dispatchEvent(new Event('input', { bubbles: true }));
	})()`))
	b.poll("the form shows the step", `document.querySelectorAll('#rule-ladder .rule-step').length === 1 &&
		document.querySelector('[data-field="ladder[0].all[0].value"]').value === '95' &&
		document.querySelector('[data-field="ladder[0].severity"]').value === 'critical'`)
	b.run("save the ladder", chromedp.Click(chromedp.ID("rule-save")))
	b.poll("saved", `document.getElementById('rule-note').textContent === 'Saved.'`)
	if _, r = getRule(); asJSON(r["ladder"]) != `[{"all":[{"op":"gt","property":"temp","value":95}],"severity":"critical"}]` {
		t.Fatalf("stored ladder %s", asJSON(r["ladder"]))
	}

	// The list: disable, enable, delete.
	btn := func(action string) string { return fmt.Sprintf(`button[data-action=%s][data-rule=%q]`, action, ruleID) }
	b.run("back to the rules", chromedp.Click(chromedp.ID("rule-back")), chromedp.WaitVisible(chromedp.CSS(btn("disable"))))
	if tr := b.text(fmt.Sprintf(`tr[data-rule=%q] td.mono`, ruleID)); tr != "temp > config.maxTemp" {
		t.Fatalf("the rule's trigger reads %q", tr)
	}
	b.run("disable", chromedp.Click(chromedp.CSS(btn("disable"))), chromedp.WaitVisible(chromedp.CSS(btn("enable"))))
	if _, r = getRule(); r["enabled"] != false {
		t.Fatalf("after Disable: enabled %v", r["enabled"])
	}
	b.run("enable", chromedp.Click(chromedp.CSS(btn("enable"))), chromedp.WaitVisible(chromedp.CSS(btn("disable"))))
	if _, r = getRule(); r["enabled"] != true {
		t.Fatalf("after Enable: enabled %v", r["enabled"])
	}

	// 420 px: the list and the editor fit.
	narrowFits(b, "alarm rules", "#/alarm-rules?product="+product, btn("delete"))
	narrowFits(b, "alarm rule", "#/alarm-rule/"+ruleID, `[data-field="ladder[0].all[0].value"]`)

	b.run("back to the list", goTo("#/alarm-rules?product="+product), chromedp.WaitVisible(chromedp.CSS(btn("delete"))))
	b.run("delete", chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`), chromedp.Click(chromedp.CSS(btn("delete"))))
	b.poll("deleted", `document.getElementById('rules-list').textContent.includes('no alarm rule')`)
	if status, _ := getRule(); status != 404 {
		t.Fatalf("the deleted rule answers %d", status)
	}
	b.checkExceptions()

	// A viewer reads rules, writes none.
	srv.call(t, token, "POST", "/api/alarm/config", map[string]any{"id": ruleID, "name": "Hot", "productId": product, "severity": "major",
		"enabled": true, "trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 80}}}})
	srv.call(t, token, "POST", "/api/user", map[string]any{"username": "ro" + suffix, "password": "viewer-pass", "roles": []string{"viewer"}})
	b.run("sign out", chromedp.Click(chromedp.ID("logout")))
	signIn(b, "", "ro"+suffix, "viewer-pass", chromedp.WaitVisible(chromedp.ID("nav-alarms")))
	b.run("the viewer's rules", goTo("#/alarm-rules?product="+product), chromedp.WaitVisible(chromedp.CSS(`a.rule-name`)))
	if n := evalJS[int](b, `document.querySelectorAll('#rules-list button').length + (document.getElementById('rule-new').hidden ? 0 : 1)`); n != 0 {
		t.Fatalf("a viewer has %d rule buttons", n)
	}
	b.run("the viewer's editor", chromedp.Click(chromedp.CSS(`a.rule-name`)), chromedp.WaitVisible(chromedp.CSS(`[data-field="trigger.all[0].value"]`)))
	if n := evalJS[int](b, `(document.getElementById('rule-save').hidden ? 0 : 1) + document.querySelectorAll('#rule-form input:not([disabled]), #rule-form select:not([disabled]), #rule-form button:not([disabled]), #rule-json:not([disabled])').length`); n != 0 {
		t.Fatalf("a viewer's rule editor has %d controls that write", n)
	}
	b.checkExceptions()
}

// signIn signs in on the console (opening it at base first, unless base
// is ""), then waits for ready.
func signIn(b *browser, base, user, password string, ready chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	var open []chromedp.Action[chromedp.Void]
	if base != "" {
		open = append(open, chromedp.Navigate(base+"/"))
	}
	b.run("sign in as "+user, append(open,
		chromedp.WaitVisible(chromedp.ID("login-form")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('login-user').value = ''; document.getElementById('login-password').value = ''`),
		chromedp.SendKeys(chromedp.ID("login-user"), user),
		chromedp.SendKeys(chromedp.ID("login-password"), password),
		chromedp.Click(chromedp.ID("login-submit")),
		ready)...)
}

// narrowFits opens a page at 420 px wide and fails when it, or its
// header, is wider than the window.
func narrowFits(b *browser, name, hash, ready string) {
	b.t.Helper()
	b.run("a narrow window", chromedp.EmulateViewport(420, 860))
	defer b.run("a wide window", chromedp.EmulateViewport(1366, 860))
	b.run("open "+name+" at 420 px", goTo(hash), chromedp.WaitVisible(chromedp.CSS(ready)))
	b.narrowShot("narrow-" + name)
	if w := evalJS[[]int](b, `[document.scrollingElement.scrollWidth, innerWidth, document.querySelector('#top').scrollWidth, document.querySelector('#top').clientWidth]`); w[0] > w[1] || w[2] > w[3] {
		b.t.Fatalf("%s at 420 px: page %d px wide in a %d px window, header %d in %d", name, w[0], w[1], w[2], w[3])
	}
}

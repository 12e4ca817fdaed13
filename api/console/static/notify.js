// notify.js: the Notifications pages over /api/notify (api/notify.go,
// ingest/notify; permission notify:admin):
//   #/notify                 channels: a webhook, e-mail over SMTP or a
//                            publish to another MQTT broker; create, edit,
//                            delete, and _test, showing what the other
//                            side answered
//   #/notify/subscriptions   which alarms go to which channels: products,
//                            rules, lowest severity, transitions, the
//                            escalation chain, reminders, quiet time
//   #/notify/dead            dead letters, the latest first; replay
//   #/notify/forward         forwarding rules (forward.js)
// A refusal (400) is shown beside the field it names.
'use strict';

const CHANNEL_KINDS = [['webhook', 'Webhook'], ['email', 'E-mail (SMTP)'], ['mqtt', 'MQTT broker']];
const NOTIFY_SEVERITIES = ['info', 'warning', 'minor', 'major', 'critical']; // from the lowest
const NOTIFY_KINDS = ['raised', 'escalated', 'deescalated', 'acknowledged', 'cleared'];

// durMs reads a duration ("90s", "15m", "1h30m", "500ms", or ms as a
// number) as milliseconds; '' is 0; NaN when it does not read.
function durMs(text) {
  const t = String(text).trim();
  if (t === '') return 0;
  if (/^\d+$/.test(t)) return Number(t);
  const units = { ms: 1, s: 1e3, m: 60e3, h: 3600e3, d: 86400e3 };
  let ms = 0;
  let rest = t;
  while (rest) {
    const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)/.exec(rest);
    if (!m) return NaN;
    ms += Number(m[1]) * units[m[2]];
    rest = rest.slice(m[0].length);
  }
  return Math.round(ms);
}

// msText writes milliseconds as durMs reads them.
function msText(ms) {
  if (!ms) return '';
  for (const [u, n] of [['d', 86400e3], ['h', 3600e3], ['m', 60e3], ['s', 1e3]]) if (ms % n === 0) return ms / n + u;
  return ms + 'ms';
}

// notifyTabs is the pages' head: a tab per page, the current one marked.
function notifyTabs(view, active, title) {
  const tabs = [['channels', '#/notify', 'Channels'], ['subscriptions', '#/notify/subscriptions', 'Subscriptions'], ['dead', '#/notify/dead', 'Dead letters'],
    ['forward', '#/notify/forward', 'Forwarding']];
  view.append(h('div', { class: 'page-head' }, h('h1', {}, title),
    h('nav', { class: 'tabs', 'aria-label': 'Notification pages' }, tabs.map(([k, href, text]) =>
      h('a', { href, class: k === active ? 'active' : '', 'data-tab': k, 'aria-current': k === active ? 'page' : null }, text)))));
}

// notifyNote is a page's status line: say(text, isError).
function notifyNote(id) {
  const note = h('p', { id, role: 'status', class: 'muted small' });
  note.say = (text, isError) => { note.textContent = text; note.className = isError ? 'error' : 'ok-text small'; };
  return note;
}

// ---- channels ---------------------------------------------------------

function channelTarget(c) {
  if (c.webhook) return (c.webhook.method || 'POST') + ' ' + c.webhook.url;
  if (c.email) return c.email.host + ':' + c.email.port + ' → ' + (c.email.to || []).join(', ');
  if (c.mqtt) return c.mqtt.broker + ' ' + c.mqtt.topic;
  return '';
}

// testResult shows a _test answer: delivered or not, the other side's
// status and answer (its body, as it said it), the error, how long it
// took.
function testResult(r) {
  const parts = [r.delivered ? 'Delivered' : 'Not delivered'];
  if (r.status) parts.push('status ' + r.status);
  parts.push(r.millis + ' ms');
  return [h('span', { class: 'test-summary' }, parts.join(', ') + '.'),
    r.error ? h('div', { class: 'test-error' }, 'Error: ' + r.error) : null,
    r.answer ? h('div', {}, 'The other side answered: ', h('q', { class: 'test-answer mono' }, r.answer)) : null];
}

function notifyChannelsView(view) {
  notifyTabs(view, 'channels', 'Notifications');
  let channels = [];
  const page = editPage(view, {
    id: 'channel', listId: 'channels-list', title: 'Channels', newText: 'New channel', path: '/api/notify/channel', noun: 'channel', what: 'channels',
    onNew: () => edit(null),
    note: notifyNote('channels-note'),
    fetch: () => api('POST', '/api/notify/channel/_query', {}),
    show: (res) => {
      channels = (res.data || []).slice().sort(byName);
      draw();
    },
  });
  const { list, editor, act } = page;
  const test = (c, out) => async () => {
    out.hidden = false;
    out.className = 'channel-test muted small';
    out.textContent = 'Sending a test message…';
    try {
      const r = await api('POST', '/api/notify/channel/' + encodeURIComponent(c.id) + '/_test');
      out.className = 'channel-test small ' + (r.delivered ? 'ok-text' : 'error');
      out.dataset.delivered = String(r.delivered);
      out.replaceChildren(...testResult(r).filter(Boolean));
    } catch (e) {
      out.className = 'channel-test error';
      out.textContent = describe(e);
    }
  };
  function draw() {
    if (channels.length === 0) {
      list.replaceChildren(empty('No channel yet.', 'A channel is where notifications go: a webhook, a mailbox or an MQTT broker.'));
      return;
    }
    list.replaceChildren(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Channel', 'Kind', 'Where', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, channels.map((c) => {
        const out = h('div', { class: 'channel-test', 'data-channel': c.id, role: 'status', hidden: true });
        return h('tr', { 'data-channel': c.id },
          h('td', {}, h('span', { class: 'strong' }, c.name), h('div', { class: 'muted small mono' }, c.id)),
          h('td', {}, c.kind, c.hasSecret ? h('div', { class: 'muted small' }, c.kind === 'webhook' ? 'signed' : 'with a password') : ''),
          h('td', { class: 'mono small wrap' }, channelTarget(c), out),
          h('td', { class: 'controls' },
            h('button', { type: 'button', class: 'secondary', 'data-action': 'test', 'data-channel': c.id, onclick: test(c, out) }, 'Test'),
            h('button', { type: 'button', class: 'secondary', 'data-action': 'edit', 'data-channel': c.id, onclick: () => edit(c) }, 'Edit'),
            h('button', { type: 'button', class: 'secondary', 'data-action': 'delete', 'data-channel': c.id, onclick: act(c, 'delete') }, 'Delete')));
      }))));
  }

  // edit opens the form for channel c (null: a new one).
  function edit(c) {
    c = c || { kind: 'webhook', webhook: { url: '', method: 'POST' } };
    const w = c.webhook || {};
    const m = c.email || {};
    const q = c.mqtt || {};
    const inp = fieldInput;
    const area = (field, value, attrs) => { const a = h('textarea', Object.assign({ 'data-field': field, rows: 3, spellcheck: 'false' }, attrs || {})); a.value = value || ''; return a; };
    const label = fieldLabel;
    const f = {
      id: inp('id', c.id, { id: 'channel-id', placeholder: 'generated if empty', disabled: !!c.id }),
      name: inp('name', c.name, { id: 'channel-name', placeholder: 'e.g. On-call webhook' }),
      kind: h('select', { 'data-field': 'kind', id: 'channel-kind', disabled: !!c.id }, CHANNEL_KINDS.map(([v, t]) => h('option', { value: v, selected: v === c.kind }, t))),
      secret: inp('secret', '', { id: 'channel-secret', type: 'password', placeholder: c.hasSecret ? 'unchanged if empty' : 'none', autocomplete: 'new-password' }),
      url: inp('webhook.url', w.url, { id: 'channel-url', type: 'url', placeholder: 'https://…' }),
      method: h('select', { 'data-field': 'webhook.method', id: 'channel-method' }, ['POST', 'PUT', 'PATCH'].map((v) => h('option', { value: v, selected: v === (w.method || 'POST') }, v))),
      headers: area('webhook.headers', headerText(w.headers), { id: 'channel-headers', placeholder: 'Name: value, one a line' }),
      wtemplate: area('webhook.template', w.template, { id: 'channel-webhook-template', placeholder: 'the notification as JSON if empty; a Go template over it otherwise' }),
      wtimeout: inp('webhook.timeoutMs', w.timeoutMs, { type: 'number', min: 0, placeholder: '10000' }),
      host: inp('email.host', m.host, { id: 'channel-host' }),
      port: inp('email.port', m.port || 25, { type: 'number', min: 1, max: 65535, id: 'channel-port' }),
      starttls: h('input', { type: 'checkbox', 'data-field': 'email.starttls', checked: !!m.starttls }),
      username: inp('email.username', m.username),
      from: inp('email.from', m.from, { id: 'channel-from' }),
      to: inp('email.to', (m.to || []).join(', '), { id: 'channel-to', placeholder: 'a@example.com, b@example.com' }),
      subject: inp('email.subject', m.subject, { placeholder: 'the default subject if empty' }),
      etemplate: area('email.template', m.template, { placeholder: 'the default text if empty' }),
      etimeout: inp('email.timeoutMs', m.timeoutMs, { type: 'number', min: 0, placeholder: '10000' }),
      broker: inp('mqtt.broker', q.broker, { id: 'channel-broker', placeholder: 'tcp://host:1883' }),
      topic: inp('mqtt.topic', q.topic, { id: 'channel-topic' }),
      qos: h('select', { 'data-field': 'mqtt.qos' }, [0, 1, 2].map((v) => h('option', { value: v, selected: v === (q.qos || 0) }, 'QoS ' + v))),
      retain: h('input', { type: 'checkbox', 'data-field': 'mqtt.retain', checked: !!q.retain }),
      musername: inp('mqtt.username', q.username),
      clientId: inp('mqtt.clientId', q.clientId),
      mtemplate: area('mqtt.template', q.template, { placeholder: 'the notification as JSON if empty' }),
      mtimeout: inp('mqtt.timeoutMs', q.timeoutMs, { type: 'number', min: 0, placeholder: '10000' }),
    };
    const sets = {
      webhook: h('fieldset', { class: 'fields', 'data-field': 'webhook' }, h('legend', {}, 'Webhook'),
        label('URL', f.url), label('Method', f.method), label('Headers', f.headers), label('Body template', f.wtemplate), label('Timeout (ms)', f.wtimeout)),
      email: h('fieldset', { class: 'fields', 'data-field': 'email' }, h('legend', {}, 'E-mail over SMTP'),
        label('Host', f.host), label('Port', f.port), h('label', { class: 'check' }, f.starttls, 'STARTTLS'), label('User', f.username),
        label('From', f.from), label('To', f.to), label('Subject', f.subject), label('Text template', f.etemplate), label('Timeout (ms)', f.etimeout)),
      mqtt: h('fieldset', { class: 'fields', 'data-field': 'mqtt' }, h('legend', {}, 'MQTT broker'),
        label('Broker', f.broker), label('Topic', f.topic), label('QoS', f.qos), h('label', { class: 'check' }, f.retain, 'retain'),
        label('User', f.musername), label('Client id', f.clientId), label('Payload template', f.mtemplate), label('Timeout (ms)', f.mtimeout)),
    };
    const showKind = () => { for (const [k, s] of Object.entries(sets)) s.hidden = k !== f.kind.value; };
    f.kind.addEventListener('change', showKind);
    showKind();
    const num = (el) => (el.value.trim() === '' ? undefined : Number(el.value));
    const str = (el) => el.value.trim() || undefined;
    const read = () => {
      const out = { name: f.name.value, kind: f.kind.value };
      if (f.id.value.trim()) out.id = f.id.value.trim();
      if (f.secret.value) out.secret = f.secret.value;
      if (out.kind === 'webhook') {
        out.webhook = { url: f.url.value.trim(), method: f.method.value, headers: headerLines(f.headers.value), template: f.wtemplate.value || undefined, timeoutMs: num(f.wtimeout) };
      } else if (out.kind === 'email') {
        out.email = { host: f.host.value.trim(), port: num(f.port), starttls: f.starttls.checked, username: str(f.username), from: f.from.value.trim(),
          to: f.to.value.split(',').map((s) => s.trim()).filter(Boolean), subject: str(f.subject), template: f.etemplate.value || undefined, timeoutMs: num(f.etimeout) };
      } else {
        out.mqtt = { broker: f.broker.value.trim(), topic: f.topic.value.trim(), qos: Number(f.qos.value), retain: f.retain.checked,
          username: str(f.musername), clientId: str(f.clientId), template: f.mtemplate.value || undefined, timeoutMs: num(f.mtimeout) };
      }
      return out;
    };
    const save = h('button', { type: 'submit', id: 'channel-save' }, c.id ? 'Save' : 'Create');
    const form = h('form', { class: 'channel-form', id: 'channel-form' },
      h('h3', {}, c.id ? 'Edit ' + c.name : 'New channel'),
      h('div', { class: 'fields' }, label('Id', f.id), label('Name', f.name), label('Kind', f.kind),
        label(c.kind === 'webhook' || !c.id ? 'Secret (webhook: HMAC key; else the password)' : 'Password', f.secret)),
      Object.values(sets),
      h('div', { class: 'controls' }, save, h('button', { type: 'button', class: 'secondary', onclick: () => editor.replaceChildren() }, 'Cancel')));
    page.open(form, save, c, read);
    f.name.focus();
  }
  page.load();
  return { leave: page.stop };
}

// ---- subscriptions ----------------------------------------------------

function notifySubscriptionsView(view) {
  notifyTabs(view, 'subscriptions', 'Notifications');
  let subs = [];
  let channels = [];
  let products = [];
  const page = editPage(view, {
    id: 'subscription', listId: 'subscriptions-list', title: 'Subscriptions', newText: 'New subscription', path: '/api/notify/subscription', noun: 'subscription', what: 'subscriptions',
    // The form offers the products and channels: it opens once they are
    // loaded (a click before waits for them).
    onNew: () => loaded.then(() => edit(null)),
    note: notifyNote('subscriptions-note'),
    fetch: () => Promise.all([
      api('POST', '/api/notify/subscription/_query', {}),
      api('POST', '/api/notify/channel/_query', {}),
      api('POST', '/api/device-product/_query', { pageSize: 500, sorts: [{ name: 'name', order: 'asc' }] }),
    ]),
    show: ([s, c, p]) => {
      subs = (s.data || []).slice().sort(byName);
      channels = (c.data || []).slice().sort(byName);
      products = (p.data || []).slice().sort(byName);
      draw();
    },
  });
  const { list, editor, act } = page;
  const channelName = (id) => (channels.find((c) => c.id === id) || { name: id }).name;
  const chainText = (s) => s.channels.map((c, i) => (i === 0 ? '' : ' → after ' + msText(s.escalateMs[i - 1]) + ' unacknowledged: ') + channelName(c)).join('');
  function draw() {
    if (subs.length === 0) {
      list.replaceChildren(empty('No subscription yet.', channels.length ? 'A subscription sends a product\'s alarms to channels.' : 'Make a channel first.'));
      return;
    }
    list.replaceChildren(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Subscription', 'Alarms', 'Channels', 'Timing', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, subs.map((s) => h('tr', { 'data-subscription': s.id },
        h('td', {}, h('span', { class: 'strong' }, s.name), h('div', { class: 'muted small mono' }, s.id),
          s.enabled ? '' : h('span', { class: 'badge warn' }, 'disabled')),
        h('td', { class: 'small' }, 'products ' + s.products.join(', '), h('div', {}, (s.rules.length ? 'rules ' + s.rules.join(', ') : 'every rule') + ', ' + s.minSeverity + ' and up'),
          h('div', { class: 'muted' }, s.kinds.join(', '))),
        h('td', { class: 'small sub-chain' }, chainText(s)),
        h('td', { class: 'small' }, s.remindMs ? 'remind every ' + msText(s.remindMs) : 'no reminder', h('div', {}, s.quietMs ? 'at most one per ' + msText(s.quietMs) : 'no quiet time')),
        h('td', { class: 'controls' },
          h('button', { type: 'button', class: 'secondary', 'data-action': 'edit', 'data-subscription': s.id, onclick: () => edit(s) }, 'Edit'),
          h('button', { type: 'button', class: 'secondary', 'data-action': 'delete', 'data-subscription': s.id, onclick: act(s, 'delete') }, 'Delete')))))));
  }

  function edit(s) {
    s = s || { name: '', products: [], rules: [], minSeverity: 'info', kinds: ['raised'], channels: [], escalateMs: [], remindMs: 0, quietMs: 0, enabled: true };
    const label = fieldLabel;
    const name = h('input', { id: 'subscription-name', 'data-field': 'name', value: s.name, autocomplete: 'off' });
    const prodBox = h('fieldset', { class: 'checks', 'data-field': 'products', id: 'subscription-products' }, h('legend', {}, 'Products'),
      products.map((p) => h('label', { class: 'check' }, h('input', { type: 'checkbox', value: p.id, checked: s.products.includes(p.id) }), p.name || p.id)),
      s.products.filter((id) => !products.some((p) => p.id === id)).map((id) => h('label', { class: 'check' }, h('input', { type: 'checkbox', value: id, checked: true }), id)));
    const rules = h('input', { id: 'subscription-rules', 'data-field': 'rules', value: s.rules.join(', '), placeholder: 'every rule if empty; else rule ids, comma separated' });
    const sev = h('select', { id: 'subscription-severity', 'data-field': 'minSeverity' }, NOTIFY_SEVERITIES.map((v) => h('option', { value: v, selected: v === s.minSeverity }, v + ' and up')));
    const kinds = h('fieldset', { class: 'checks', 'data-field': 'kinds', id: 'subscription-kinds' }, h('legend', {}, 'Transitions'),
      NOTIFY_KINDS.map((k) => h('label', { class: 'check' }, h('input', { type: 'checkbox', value: k, checked: s.kinds.includes(k) }), k)));
    const chain = h('div', { class: 'sub-steps', 'data-field': 'channels', id: 'subscription-chain' });
    const steps = s.channels.length ? s.channels.map((c, i) => ({ channel: c, after: i ? msText(s.escalateMs[i - 1]) : '' })) : [{ channel: (channels[0] || {}).id || '', after: '' }];
    const drawChain = () => {
      chain.replaceChildren(...steps.map((st, i) => h('div', { class: 'controls sub-step' },
        i === 0 ? h('span', { class: 'small' }, 'First to') : h('label', { class: 'inline small' }, 'then, not acknowledged after ',
          h('input', { class: 'duration', 'data-field': 'escalateMs[' + (i - 1) + ']', value: st.after, placeholder: 'e.g. 15m', oninput: (e) => { st.after = e.target.value; } }), ', to'),
        h('select', { 'data-field': 'channels[' + i + ']', class: 'sub-channel', onchange: (e) => { st.channel = e.target.value; } },
          channels.map((c) => h('option', { value: c.id, selected: c.id === st.channel }, c.name))),
        i > 0 ? h('button', { type: 'button', class: 'secondary', onclick: () => { steps.splice(i, 1); drawChain(); } }, '✕') : null)),
      h('button', { type: 'button', class: 'secondary', id: 'subscription-step-add', onclick: () => { steps.push({ channel: (channels[0] || {}).id || '', after: '' }); drawChain(); } }, '+ Escalate'));
    };
    drawChain();
    const remind = h('input', { class: 'duration', 'data-field': 'remindMs', id: 'subscription-remind', value: msText(s.remindMs), placeholder: 'none' });
    const quiet = h('input', { class: 'duration', 'data-field': 'quietMs', id: 'subscription-quiet', value: msText(s.quietMs), placeholder: 'none' });
    const enabled = h('input', { type: 'checkbox', 'data-field': 'enabled', id: 'subscription-enabled', checked: s.enabled });
    const save = h('button', { type: 'submit', id: 'subscription-save' }, s.id ? 'Save' : 'Create');
    const form = h('form', { class: 'sub-form', id: 'subscription-form' },
      h('h3', {}, s.id ? 'Edit ' + s.name : 'New subscription'),
      h('div', { class: 'fields' }, label('Name', name), label('Lowest severity', sev), label('Rules', rules)),
      prodBox, kinds,
      h('fieldset', { class: 'fields' }, h('legend', {}, 'Channels: the escalation chain'), chain),
      h('div', { class: 'fields' }, label('Remind every (while active, unacknowledged)', remind), label('Quiet: at most one per alarm per', quiet),
        h('label', { class: 'check' }, enabled, 'enabled')),
      h('div', { class: 'controls' }, save, h('button', { type: 'button', class: 'secondary', onclick: () => editor.replaceChildren() }, 'Cancel')));
    const read = () => {
      const checked = (box) => [...box.querySelectorAll('input:checked')].map((i) => i.value);
      const body = {
        name: name.value, products: checked(prodBox), rules: rules.value.split(',').map((x) => x.trim()).filter(Boolean),
        minSeverity: sev.value, kinds: checked(kinds), channels: steps.map((st) => st.channel),
        escalateMs: steps.slice(1).map((st) => durMs(st.after)), remindMs: durMs(remind.value), quietMs: durMs(quiet.value), enabled: enabled.checked,
      };
      for (const [k, v] of [['remindMs', body.remindMs], ['quietMs', body.quietMs], ...body.escalateMs.map((v, i) => ['escalateMs[' + i + ']', v])]) {
        if (Number.isNaN(v)) throw new ApiError(400, 'illegal_argument', k + ': not a duration (e.g. 90s, 15m, 1h)');
      }
      return body;
    };
    page.open(form, save, s, read);
    name.focus();
  }
  const loaded = page.load();
  return { leave: page.stop };
}

// ---- dead letters -----------------------------------------------------

function notifyDeadView(view, params) {
  notifyTabs(view, 'dead', 'Notifications');
  const note = notifyNote('dead-note');
  const list = h('div', { class: 'table-wrap', id: 'dead-list' });
  const pager = h('div', { class: 'pager' });
  view.append(h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Dead letters'),
    h('span', { class: 'muted small' }, 'Notifications that failed every attempt. Replay sends one again, with its idempotency key.')), note, list, pager));
  let seq = 0;
  let pageIndex = Number(params.get('page')) || 0;
  async function load() {
    const mine = ++seq;
    list.classList.add('loading');
    try {
      const res = await api('POST', '/api/notify/dead/_query', { pageIndex, pageSize: PAGE_SIZE });
      if (mine !== seq) return;
      draw(res);
    } catch (e) {
      if (mine === seq) list.replaceChildren(errorBox(e, 'Could not load the dead letters'));
    } finally {
      if (mine === seq) list.classList.remove('loading');
    }
  }
  const replay = (d, btn) => async () => {
    btn.disabled = true;
    try {
      await api('POST', '/api/notify/dead/' + encodeURIComponent(d.id) + '/_replay');
      note.say('Dead letter ' + d.id + ' replayed: it is queued again.');
      load();
    } catch (e) {
      note.say(describe(e), true);
      btn.disabled = false;
    }
  };
  function draw(res) {
    const data = res.data || [];
    if (data.length === 0) {
      list.replaceChildren(empty('No dead letter.', 'Notifications that fail every attempt land here.'));
      pager.replaceChildren();
      return;
    }
    list.replaceChildren(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Died', 'Alarm', 'Channel', 'Attempts', 'Last error', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, data.map((d) => {
        const a = d.alarm || {};
        const btn = h('button', { type: 'button', class: 'secondary', 'data-action': 'replay', 'data-dead': d.id });
        btn.textContent = 'Replay';
        btn.addEventListener('click', replay(d, btn));
        return h('tr', { 'data-dead': d.id },
          h('td', { class: 'small' }, when(d.deadTime)),
          h('td', { class: 'small' }, h('span', { class: 'badge severity-' + a.severity }, a.severity || ''), ' ', a.ruleName || '', ' · ', a.deviceId || '',
            h('div', { class: 'muted' }, d.kind + (d.step && d.step !== '0' ? ', ' + d.step : ''))),
          h('td', { class: 'small' }, d.channelId, h('div', { class: 'muted' }, d.subscriptionId)),
          h('td', {}, String(d.attempts)),
          h('td', { class: 'small wrap dead-error' }, d.lastError),
          h('td', {}, btn));
      }))));
    const from = pageIndex * PAGE_SIZE + 1;
    pager.replaceChildren(h('span', { class: 'muted' }, `${count(from)}–${count(from + data.length - 1)} of ${count(res.total)}`),
      h('button', { type: 'button', class: 'secondary', disabled: pageIndex === 0, onclick: () => { pageIndex--; load(); } }, '‹ Previous'),
      h('button', { type: 'button', class: 'secondary', disabled: from + data.length - 1 >= res.total, onclick: () => { pageIndex++; load(); } }, 'Next ›'));
  }
  load();
  return { leave: () => { seq++; } };
}

// forward.js: the Notifications pages' forwarding rules (#/notify/forward)
// over /api/notify/forward (api/forward.go, ingest/forward; notify:admin):
// a product's telemetry (narrowed by devices, message types, properties)
// to a webhook (JSON lines in batches) or another MQTT broker. Each rule
// shows its status as the forwarder last wrote it: lag, messages pending
// and spooled on disk, dropped at the spool's bound, sent, failed, the
// last error. Create, edit, enable, disable, delete; a refusal (400)
// beside the field it names.
'use strict';

const FORWARD_TYPES = [['property', 'property reports'], ['event', 'events'], ['online', 'online'], ['offline', 'offline']];

function forwardSink(r) {
  if (r.webhook) return 'POST ' + r.webhook.url + ' (batches of ' + r.webhook.batchSize + ' or ' + r.webhook.batchMs + ' ms)';
  if (r.mqtt) return r.mqtt.broker + ' ' + r.mqtt.topic;
  return '';
}

function forwardFilter(r) {
  const parts = [];
  parts.push(r.deviceIds && r.deviceIds.length ? 'devices ' + r.deviceIds.join(', ') : 'every device');
  parts.push(r.types && r.types.length ? r.types.join(', ') : 'every message type');
  if (r.properties && r.properties.length) parts.push('properties ' + r.properties.join(', '));
  return parts.join('; ');
}

// forwardStatus is a rule's status cell: caught up or its lag, the
// counts, the last error.
function forwardStatus(s) {
  if (!s) return h('span', { class: 'muted small forward-status' }, 'no status yet (the forwarder writes it about every second)');
  const lag = s.lagMs > 0 ? 'lag ' + msText(s.lagMs) : 'caught up';
  return h('div', { class: 'small forward-status', 'data-sent': s.sent, 'data-lag': s.lagMs, 'data-pending': s.pending },
    h('span', { class: 'badge ' + (s.lagMs > 0 || s.lastError ? 'warn' : 'ok') }, lag), ' ',
    `${count(s.sent)} sent, ${count(s.pending)} pending (${bytesText(s.spooledBytes)} on disk), ${count(s.failed)} failed, ${count(s.dropped)} dropped`,
    s.lastError ? h('div', { class: 'error small forward-error' }, s.lastError) : null,
    h('div', { class: 'muted' }, 'as of ' + when(s.updateTime)));
}

function notifyForwardView(view) {
  notifyTabs(view, 'forward', 'Notifications');
  let rules = [];
  let products = [];
  let timer = 0;
  const page = editPage(view, {
    id: 'forward', title: 'Forwarding rules', newText: 'New forwarding rule', path: '/api/notify/forward',
    noun: 'forwarding rule', deleteNote: 'What its spool holds unsent is dropped.', what: 'forwarding rules',
    // The form offers the products: it opens once they are loaded.
    onNew: () => loaded.then(() => edit(null)),
    head: h('p', { class: 'muted small' }, 'Telemetry sent on to other systems, at least once and in order per device; a sink that is down is caught up from a spool on disk.'),
    note: notifyNote('forward-note'),
    fetch: () => {
      clearTimeout(timer);
      return Promise.all([
        api('POST', '/api/notify/forward/_query', {}),
        products.length ? { data: products } : api('POST', '/api/device-product/_query', { pageSize: 500, sorts: [{ name: 'name', order: 'asc' }] }),
      ]);
    },
    show: ([r, p]) => {
      rules = (r.data || []).slice().sort(byName);
      products = (p.data || []).slice().sort(byName);
      draw();
      timer = setTimeout(page.load, 3000); // the status moves: read it again
    },
  });
  const { list, editor, act } = page;
  // draw redraws the table when the rules changed; when only their
  // status did, it replaces the status cells (the buttons stay put).
  let drawn = '';
  function draw() {
    const shape = JSON.stringify(rules.map((r) => Object.assign({}, r, { status: undefined })));
    if (shape === drawn && rules.length) {
      for (const r of rules) {
        const cell = list.querySelector(`tr[data-forward="${CSS.escape(r.id)}"] td.status`);
        if (cell) cell.replaceChildren(forwardStatus(r.status));
      }
      return;
    }
    drawn = shape;
    if (rules.length === 0) {
      list.replaceChildren(empty('No forwarding rule yet.', 'A rule sends a product\'s messages to a webhook or another MQTT broker.'));
      return;
    }
    list.replaceChildren(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Rule', 'Messages', 'To', 'Status', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, rules.map((r) => h('tr', { 'data-forward': r.id },
        h('td', {}, h('span', { class: 'strong' }, r.name), h('div', { class: 'muted small mono' }, r.id),
          h('span', { class: 'badge ' + (r.enabled ? 'ok' : 'warn') + ' forward-enabled' }, r.enabled ? 'enabled' : 'disabled')),
        h('td', { class: 'small' }, 'product ' + r.productId, h('div', { class: 'muted' }, forwardFilter(r))),
        h('td', { class: 'small mono wrap' }, r.kind, ': ', forwardSink(r)),
        h('td', { class: 'status' }, forwardStatus(r.status)),
        h('td', { class: 'controls' },
          h('button', { type: 'button', class: 'secondary', 'data-action': r.enabled ? 'disable' : 'enable', 'data-forward': r.id, onclick: act(r, r.enabled ? 'disable' : 'enable') }, r.enabled ? 'Disable' : 'Enable'),
          h('button', { type: 'button', class: 'secondary', 'data-action': 'edit', 'data-forward': r.id, onclick: () => edit(r) }, 'Edit'),
          h('button', { type: 'button', class: 'secondary', 'data-action': 'delete', 'data-forward': r.id, onclick: act(r, 'delete') }, 'Delete')))))));
  }

  function edit(r) {
    clearTimeout(timer);
    page.stop(); // no redraw under the form
    r = r || { name: '', productId: (products[0] || {}).id || '', deviceIds: [], types: [], properties: [], kind: 'webhook', webhook: { url: '' }, enabled: true };
    const w = r.webhook || {};
    const m = r.mqtt || {};
    const label = fieldLabel;
    const inp = fieldInput;
    const f = {
      id: inp('id', r.id, { id: 'forward-id', placeholder: 'generated if empty', disabled: !!r.id }),
      name: inp('name', r.name, { id: 'forward-name' }),
      product: h('select', { 'data-field': 'productId', id: 'forward-product' },
        products.map((p) => h('option', { value: p.id, selected: p.id === r.productId }, (p.name || p.id) + ' (' + p.id + ')'))),
      devices: inp('deviceIds', (r.deviceIds || []).join(', '), { id: 'forward-devices', placeholder: 'every device if empty' }),
      types: h('fieldset', { class: 'checks', 'data-field': 'types', id: 'forward-types' }, h('legend', {}, 'Message types (none: all)'),
        FORWARD_TYPES.map(([v, t]) => h('label', { class: 'check' }, h('input', { type: 'checkbox', value: v, checked: (r.types || []).includes(v) }), t))),
      properties: inp('properties', (r.properties || []).join(', '), { id: 'forward-properties', placeholder: 'every property if empty' }),
      kind: h('select', { 'data-field': 'kind', id: 'forward-kind' }, [['webhook', 'Webhook (JSON lines)'], ['mqtt', 'MQTT broker']].map(([v, t]) => h('option', { value: v, selected: v === r.kind }, t))),
      secret: inp('secret', '', { id: 'forward-secret', type: 'password', autocomplete: 'new-password', placeholder: r.hasSecret ? 'unchanged if empty' : 'none' }),
      url: inp('webhook.url', w.url, { id: 'forward-url', type: 'url', placeholder: 'https://…' }),
      headers: h('textarea', { 'data-field': 'webhook.headers', id: 'forward-headers', rows: 2, placeholder: 'Name: value, one a line' }),
      batchSize: inp('webhook.batchSize', w.batchSize, { type: 'number', min: 1, placeholder: '500', id: 'forward-batch-size' }),
      batchMs: inp('webhook.batchMs', w.batchMs, { type: 'number', min: 1, placeholder: '100', id: 'forward-batch-ms' }),
      timeoutMs: inp('webhook.timeoutMs', w.timeoutMs, { type: 'number', min: 1, placeholder: '10000' }),
      broker: inp('mqtt.broker', m.broker, { id: 'forward-broker', placeholder: 'tcp://host:1883' }),
      topic: inp('mqtt.topic', m.topic, { id: 'forward-topic', placeholder: 'devicehub/{productId}/{deviceId}/{type}' }),
      username: inp('mqtt.username', m.username),
      clientId: inp('mqtt.clientId', m.clientId),
      mBatchSize: inp('mqtt.batchSize', m.batchSize, { type: 'number', min: 1, placeholder: '500' }),
      mTimeoutMs: inp('mqtt.timeoutMs', m.timeoutMs, { type: 'number', min: 1, placeholder: '10000' }),
      enabled: h('input', { type: 'checkbox', 'data-field': 'enabled', id: 'forward-enabled-box', checked: r.enabled !== false }),
    };
    f.headers.value = headerText(w.headers);
    const sets = {
      webhook: h('fieldset', { class: 'fields', 'data-field': 'webhook' }, h('legend', {}, 'Webhook'),
        label('URL', f.url), label('Headers', f.headers), label('Batch: messages', f.batchSize), label('or ms', f.batchMs), label('Timeout (ms)', f.timeoutMs)),
      mqtt: h('fieldset', { class: 'fields', 'data-field': 'mqtt' }, h('legend', {}, 'MQTT broker'),
        label('Broker', f.broker), label('Topic', f.topic), label('User', f.username), label('Client id', f.clientId),
        label('Batch: messages', f.mBatchSize), label('Timeout (ms)', f.mTimeoutMs)),
    };
    const showKind = () => { for (const [k, s] of Object.entries(sets)) s.hidden = k !== f.kind.value; };
    f.kind.addEventListener('change', showKind);
    showKind();
    const ids = (el) => el.value.split(',').map((s) => s.trim()).filter(Boolean);
    const num = (el) => (el.value.trim() === '' ? 0 : Number(el.value));
    const read = () => {
      const out = {
        name: f.name.value, productId: f.product.value, deviceIds: ids(f.devices),
        types: [...f.types.querySelectorAll('input:checked')].map((i) => i.value), properties: ids(f.properties),
        kind: f.kind.value, enabled: f.enabled.checked,
      };
      if (f.id.value.trim()) out.id = f.id.value.trim();
      if (f.secret.value) out.secret = f.secret.value;
      if (out.kind === 'webhook') {
        out.webhook = { url: f.url.value.trim(), headers: headerLines(f.headers.value), batchSize: num(f.batchSize), batchMs: num(f.batchMs), timeoutMs: num(f.timeoutMs) };
      } else {
        out.mqtt = { broker: f.broker.value.trim(), topic: f.topic.value.trim(), username: f.username.value.trim() || undefined,
          clientId: f.clientId.value.trim() || undefined, batchSize: num(f.mBatchSize), timeoutMs: num(f.mTimeoutMs) };
      }
      return out;
    };
    const save = h('button', { type: 'submit', id: 'forward-save' }, r.id ? 'Save' : 'Create');
    const form = h('form', { class: 'channel-form', id: 'forward-form' },
      h('h3', {}, r.id ? 'Edit ' + r.name : 'New forwarding rule'),
      h('div', { class: 'fields' }, label('Id', f.id), label('Name', f.name), label('Product', f.product), label('Devices', f.devices)),
      f.types,
      h('div', { class: 'fields' }, label('Properties', f.properties), label('To', f.kind), label('Secret (webhook: HMAC key; broker: password)', f.secret),
        h('label', { class: 'check' }, f.enabled, 'enabled')),
      Object.values(sets),
      h('div', { class: 'controls' }, save, h('button', { type: 'button', class: 'secondary', onclick: () => { editor.replaceChildren(); page.load(); } }, 'Cancel')));
    page.open(form, save, r, read);
    f.name.focus();
  }
  const loaded = page.load();
  return { leave: () => { page.stop(); clearTimeout(timer); } };
}

// core.js: the devicehub console's base, loaded first: constants, DOM
// helpers, the API client, sign-in, the signed-in user's permissions,
// routing. The console is a small single-page app over the public REST
// API and nothing else, in ordered classic scripts (index.html loads them
// in order, deferred; no build step): each file is one page or concept,
// its top-level names shared with the files after it. app.js, last,
// starts it. Views (the route is the URL hash):
//   #/                 overview (overview.js): counts and message volume
//   #/products         products, searched by name (lists.js)
//   #/devices          devices, searched by id or name, by product and state
//                      (lists.js); an import from a CSV or JSON file (import.js)
//   #/device/<id>      a device (device.js, devicemanage.js): state,
//                      properties with live values (SSE), history and
//                      aggregate charts, lifecycle, key, reads, invokes
//   #/product-new, #/product/<id>
//                      a product (product.js): create, edit, its thing
//                      model's properties as a form beside its JSON,
//                      deploy, undeploy
//   #/users            users (users.js, administrators only)
//   #/audit            the audit trail (audit.js, administrators)
//   #/alarms           alarms (alarms.js): active first by severity,
//                      filters, acknowledge and clear with a comment
//   #/alarm-rules, #/alarm-rule/<id>, #/alarm-rule-new
//                      a product's alarm rules and their editor
//                      (alarmrules.js)
//   #/notify, #/notify/subscriptions, #/notify/dead
//                      notification channels, subscriptions, dead
//                      letters (notify.js; notify:admin)
//   #/notify/forward   forwarding rules (forward.js; notify:admin)
//   #/firmware, #/firmware/rollout/<id>
//                      firmware packages and rollouts (firmware.js)
//   #/account          the signed-in user (account.js): roles,
//                      permissions, password, API keys
// The platform's time zone and charts' custom ranges: zone.js.
// What the signed-in user may not use (GET /api/authorize/me lists its
// permissions) is hidden; the server refuses it anyway (403).
// The login token lives in sessionStorage (one tab, gone with it).
'use strict';

const TOKEN = 'devicehub.token';
const USER = 'devicehub.user';
const PAGE_SIZE = 20;
const NUMERIC = new Set(['int', 'long', 'float', 'double']);
const UNITS = {
  percent: '%', turnPerSeconds: 'r/s', nanometer: 'nm', micron: 'μm', millimeter: 'mm', centimeter: 'cm',
  meter: 'm', kilometer: 'km', squareMillimeter: 'mm²', squareCentimeter: 'cm²', squareMeter: 'm²',
  squareKilometer: 'km²', hectare: 'ha', days: 'd', hour: 'h', minutes: 'min', seconds: 's',
  milliseconds: 'ms', microseconds: 'μs', nanoseconds: 'ns', cubicMillimeter: 'mm³', cubicCentimeter: 'cm³',
  cubicMeter: 'm³', cubicKilometer: 'km³', cubicMeterPerSec: 'm³/s', cubicKilometerPerSec: 'km³/s',
};

// ---- DOM helpers ------------------------------------------------------

const $ = (sel, root = document) => root.querySelector(sel);

// h builds an element: attrs are attributes, "text", "class" or on<event>
// handlers; children are nodes or text (never parsed as HTML).
function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined && c !== false) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

// csvCell is one cell of a CSV file the console writes (the imported
// devices' logins), as the API's export writes one (api/export.go
// appendCSVField, formulaLike): after a ' when a spreadsheet would take
// it for a formula (OWASP's CSV injection: a leading = + - @, tab or
// carriage return; also = + - @ after leading white space or invisible
// characters, and the fullwidth ＝ ＋ － ＠), unless it is a number as it
// stands; quoted when it holds a comma, a quote or a line break, or
// starts or ends with a space. (Tested alone: console/csvcell_test.go.)
function csvCell(v) {
  let s = String(v ?? '');
  const lead = s.replace(/^[\s\u0085\p{Cf}]+/u, '');
  const number = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(s);
  if (/^[\t\r]/.test(s) || /^[＝＋－＠]/.test(lead) || (/^[=+\-@]/.test(lead) && (lead !== s || !number))) s = "'" + s;
  if (/[",\r\n]/.test(s) || /^ | $/.test(s)) s = '"' + s.replace(/"/g, '""') + '"';
  return s;
}

const when = (ms) => (ms ? zoneText(ms) : '–'); // in the platform's zone (setZone)

// Names and ids are shown in natural, case-insensitive order, as people
// read them ("Meter 1, meter 2, Meter 10"). Paged lists come in that order
// from the server (its id and name sorts are natural) and are shown as
// they come; a whole list fetched at once for a chooser is sorted here
// with byName or byId.
const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: 'base' });
const byId = (a, b) => collator.compare(a.id, b.id) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
const byName = (a, b) => collator.compare(a.name || a.id, b.name || b.id) || byId(a, b);
const count = (n) => Number(n).toLocaleString();

// bytesText writes a size in B, KiB, MiB or GiB.
function bytesText(n) {
  let v = Number(n) || 0;
  for (const u of ['B', 'KiB', 'MiB', 'GiB']) {
    if (v < 1024 || u === 'GiB') return (u === 'B' ? v : v.toFixed(1)) + ' ' + u;
    v /= 1024;
  }
  return String(n);
}


function errorBox(err, what) {
  return h('p', { class: 'error', role: 'alert' }, (what ? what + ': ' : '') + describe(err));
}

function empty(text, hint) {
  return h('div', { class: 'empty' }, h('p', {}, text), hint ? h('p', { class: 'muted small' }, hint) : null);
}

function stateBadge(state) {
  const value = (state && state.value) || state || 'unknown';
  const text = (state && state.text) || { online: 'Online', offline: 'Offline', notActive: 'Not active' }[value] || value;
  return h('span', { class: 'badge state-' + value, 'data-state': value }, text);
}

// ---- API --------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function describe(err) {
  if (err instanceof ApiError && err.code) return `${err.message} (${err.code}, HTTP ${err.status})`;
  return err.message || String(err);
}

// api calls one endpoint and returns the envelope's result; an error
// envelope becomes an ApiError with its message and code. A 401 on a
// signed-in call signs out.
async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN);
  if (token) headers['X-Access-Token'] = token;
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, '', 'devicehub did not answer (' + e.message + ')');
  }
  let env = null;
  try {
    env = await res.json();
  } catch (e) {
    env = null;
  }
  if (!res.ok || !env) {
    const err = new ApiError(res.status, env && env.code, (env && env.message) || `HTTP ${res.status} ${res.statusText}`);
    if (res.status === 401 && token) signOut('Your session has expired: sign in again.');
    throw err;
  }
  return env.result;
}

// clearFieldErrors removes the refusals showFieldError put in root.
function clearFieldErrors(root) {
  for (const old of root.querySelectorAll('.field-error')) old.remove();
  for (const old of root.querySelectorAll('[aria-invalid]')) old.removeAttribute('aria-invalid');
}

// showFieldError shows a refusal beside the field its message names (the
// API's 400 messages start with it: "trigger.all[1].value: ...",
// "webhook.url: ..."): after root's element whose data-field is that
// field, or the nearest enclosing field that is shown ("trigger.all[1]",
// "trigger"), or else after fallback. Earlier refusals go.
function showFieldError(root, err, fallback) {
  clearFieldErrors(root.closest('main') || root);
  const m = err instanceof ApiError && err.status === 400 ? /^([A-Za-z][\w.[\]]*): (.*)$/s.exec(err.message) : null;
  const parent = (f) => { const up = f.replace(/(\.[^.[\]]*|\[\d+\])$/, ''); return up === f ? '' : up; };
  let target = null;
  for (let f = m ? m[1] : ''; f && !target; f = parent(f)) {
    target = [...root.querySelectorAll('[data-field]')].find((el) => el.dataset.field === f && !el.hidden && !el.closest('[hidden]')) || null;
  }
  const msg = h('span', { class: 'field-error error', role: 'alert', 'data-for': m ? m[1] : '' }, describe(err));
  if (!target) target = fallback;
  target.setAttribute('aria-invalid', 'true');
  if (target.matches('fieldset, .rule-group, .rule-cond, .rule-step')) target.append(msg);
  else target.after(msg);
  msg.scrollIntoView({ block: 'nearest' });
  return msg;
}

const multi = (queries) => api('POST', '/api/dashboard/_multi', queries);

// ---- pages that edit a list -------------------------------------------

// fieldInput is a form's text input for the API's field (its data-field,
// where showFieldError puts a refusal); fieldLabel a labelled control.
function fieldInput(field, value, attrs) {
  return h('input', Object.assign({ 'data-field': field, autocomplete: 'off', value: value === undefined || value === null ? '' : String(value) }, attrs || {}));
}
const fieldLabel = (text, control) => h('label', {}, text, control);

// headerLines reads "Name: value" lines (a webhook's headers) as an
// object; headerText writes one so.
function headerLines(text) {
  const headers = {};
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const i = line.indexOf(':');
    headers[(i < 0 ? line : line.slice(0, i)).trim()] = i < 0 ? '' : line.slice(i + 1).trim();
  }
  return headers;
}
const headerText = (headers) => Object.entries(headers || {}).map(([k, v]) => k + ': ' + v).join('\n');

// editPage is the frame of a page that lists one kind of object, at the
// API's collection o.path, and edits one at a time in a form above the
// list (the notification channels and subscriptions, notify.js; the
// forwarding rules, forward.js). It appends to view a card: o.title and
// a button o.newText (id o.id-new, o.onNew), o.head (more, optional),
// the status line o.note (say(text, isError)), the editor (o.id-editor)
// and the list (o.listId, or o.id-list). It returns what the pages share:
//   load()          o.fetch()es the list and o.show(s) it (an error in
//                   its place: "Could not load the " + o.what); an
//                   answer a later load or stop() overtook is dropped
//   stop()          drops the answers in flight (a form opens, the page
//                   is left)
//   act(x, action)  a button's handler on object x: 'delete' (confirmed:
//                   "Delete the " + o.noun + ...? + o.deleteNote, DELETE
//                   path/id) or another action (POST path/id/_action);
//                   says what was done and reloads, or says the refusal
//   open(form, save, x, read)
//                   shows form in the editor; its submit sends read() as
//                   a new object (POST path) or x's change (PUT path/id),
//                   then closes the form, says so and reloads; a refusal
//                   (or one read() throws) is shown beside its field
//   list, editor    the places of the list and the form
function editPage(view, o) {
  const list = h('div', { class: 'table-wrap', id: o.listId || o.id + '-list' });
  const editor = h('div', { id: o.id + '-editor' });
  const newBtn = h('button', { type: 'button', id: o.id + '-new', onclick: o.onNew }, o.newText);
  view.append(h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', {}, o.title), newBtn),
    o.head || null, o.note, editor, list));
  list.replaceChildren(h('p', { class: 'muted small' }, 'Loading…'));
  let seq = 0;
  async function load() {
    const mine = ++seq;
    try {
      const res = await o.fetch();
      if (mine === seq) o.show(res);
    } catch (e) {
      if (mine === seq) list.replaceChildren(errorBox(e, 'Could not load the ' + o.what));
    }
  }
  const url = (x) => o.path + '/' + encodeURIComponent(x.id);
  const act = (x, action) => async () => {
    if (action === 'delete' && !window.confirm('Delete the ' + o.noun + ' ' + x.name + '?' + (o.deleteNote ? ' ' + o.deleteNote : ''))) return;
    try {
      if (action === 'delete') await api('DELETE', url(x));
      else await api('POST', url(x) + '/_' + action);
      o.note.say({ delete: 'Deleted ', enable: 'Enabled ', disable: 'Disabled ' }[action] + x.name + '.');
      load();
    } catch (e) {
      o.note.say(describe(e), true);
    }
  };
  function open(form, save, x, read) {
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      save.disabled = true;
      try {
        const body = read();
        const out = x.id ? await api('PUT', url(x), body) : await api('POST', o.path, body);
        editor.replaceChildren();
        o.note.say((x.id ? 'Saved ' : 'Created ') + out.name + '.');
        load();
      } catch (e) {
        showFieldError(form, e, save);
      } finally {
        save.disabled = false;
      }
    });
    editor.replaceChildren(form);
  }
  return { load, stop: () => { seq++; }, act, open, list, editor };
}

// ---- login ------------------------------------------------------------

function showLogin(message) {
  $('#top').hidden = true;
  $('#view').hidden = true;
  $('#login').hidden = false;
  const err = $('#login-error');
  err.hidden = !message;
  err.textContent = message || '';
  $('#login-user').focus();
}

// ---- the signed-in user: its permissions --------------------------------

let me = null; // GET /api/authorize/me: {id, username, roles, permissions}
const can = (permission) => !!(me && (me.permissions || []).includes(permission));

function signOut(message) {
  me = null;
  sessionStorage.removeItem(TOKEN);
  sessionStorage.removeItem(USER);
  leaveView();
  $('#view').replaceChildren();
  showLogin(message);
}

$('#login-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const button = $('#login-submit');
  const err = $('#login-error');
  button.disabled = true;
  err.hidden = true;
  try {
    const username = $('#login-user').value.trim();
    const res = await api('POST', '/api/authorize/login', { username, password: $('#login-password').value });
    sessionStorage.setItem(TOKEN, res.token);
    sessionStorage.setItem(USER, res.username || username);
    $('#login-password').value = '';
    route();
  } catch (e) {
    err.textContent = describe(e);
    err.hidden = false;
  } finally {
    button.disabled = false;
  }
});

$('#logout').addEventListener('click', async () => {
  try {
    await api('POST', '/api/authorize/logout');
  } catch (e) {
    // signed out either way
  }
  signOut('You are signed out.');
});

// ---- routing ----------------------------------------------------------

let current = null; // the view on screen: {leave()}

function leaveView() {
  if (current && current.leave) current.leave();
  current = null;
}

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const q = raw.indexOf('?');
  return { path: q < 0 ? raw : raw.slice(0, q), params: new URLSearchParams(q < 0 ? '' : raw.slice(q + 1)) };
}

// keepInURL records a view's search in the hash without a new history
// entry or a re-render.
function keepInURL(path, params) {
  for (const [k, v] of [...params]) if (v === '' || v === '0') params.delete(k);
  const qs = params.toString();
  history.replaceState(null, '', '#' + path + (qs ? '?' + qs : ''));
}

function route() {
  leaveView();
  document.title = 'devicehub console';
  if (!sessionStorage.getItem(TOKEN)) {
    showLogin();
    return;
  }
  if (!me) {
    Promise.all([api('GET', '/api/authorize/me'), loadZone()]).then(([u]) => { me = u; route(); }, (e) => {
      if (sessionStorage.getItem(TOKEN)) showLogin('Could not load your account: ' + describe(e));
    });
    return;
  }
  $('#login').hidden = true;
  $('#top').hidden = false;
  $('#nav-users').hidden = !can('user:admin');
  $('#nav-audit').hidden = !can('user:admin');
  $('#nav-alarms').hidden = !can('alarm:read');
  $('#nav-notify').hidden = !can('notify:admin');
  $('#nav-firmware').hidden = !can('device:read');
  $('#whoami').textContent = sessionStorage.getItem(USER) || '';
  const view = $('#view');
  view.hidden = false;
  view.replaceChildren();
  const { path, params } = parseHash();
  let nav = '';
  let m;
  if (path === '/') {
    nav = 'overview';
    current = overviewView(view);
  } else if (path === '/products') {
    nav = 'products';
    current = productsView(view, params);
  } else if (path === '/devices') {
    nav = 'devices';
    current = devicesView(view, params);
  } else if (path === '/users' && can('user:admin')) {
    nav = 'users';
    current = usersView(view, params);
  } else if (path === '/audit' && can('user:admin')) {
    nav = 'audit';
    current = auditView(view, params);
  } else if (path === '/alarms' && can('alarm:read')) {
    nav = 'alarms';
    current = alarmsView(view, params);
  } else if (path === '/alarm-rules' && can('alarm:read')) {
    nav = 'alarms';
    current = alarmRulesView(view, params);
  } else if (path === '/alarm-rule-new' && can('rule:write')) {
    nav = 'alarms';
    current = alarmRuleView(view, null, params);
  } else if ((m = path.match(/^\/alarm-rule\/(.+)$/)) && can('alarm:read')) {
    nav = 'alarms';
    current = alarmRuleView(view, decodeURIComponent(m[1]), params);
  } else if (path === '/notify' && can('notify:admin')) {
    nav = 'notify';
    current = notifyChannelsView(view);
  } else if (path === '/notify/subscriptions' && can('notify:admin')) {
    nav = 'notify';
    current = notifySubscriptionsView(view);
  } else if (path === '/notify/dead' && can('notify:admin')) {
    nav = 'notify';
    current = notifyDeadView(view, params);
  } else if (path === '/notify/forward' && can('notify:admin')) {
    nav = 'notify';
    current = notifyForwardView(view);
  } else if (path === '/firmware' && can('device:read')) {
    nav = 'firmware';
    current = firmwareView(view, params);
  } else if ((m = path.match(/^\/firmware\/rollout\/(.+)$/)) && can('device:read')) {
    nav = 'firmware';
    current = rolloutView(view, decodeURIComponent(m[1]));
  } else if (path === '/account') {
    nav = 'account';
    current = accountView(view);
  } else if (path === '/product-new' && can('product:write')) {
    nav = 'products';
    current = productView(view, null);
  } else if ((m = path.match(/^\/product\/(.+)$/))) {
    nav = 'products';
    current = productView(view, decodeURIComponent(m[1]));
  } else if ((m = path.match(/^\/device\/(.+)$/))) {
    nav = 'devices';
    current = deviceView(view, decodeURIComponent(m[1]));
  } else {
    view.append(empty('There is no page here.', 'Use the menu above.'));
  }
  document.querySelectorAll('[data-nav]').forEach((a) => a.classList.toggle('active', a.dataset.nav === nav));
}

window.addEventListener('hashchange', route);

// onResize redraws charts after the window settles; it returns the
// function that stops listening.
function onResize(fn) {
  let timer = 0;
  const handler = () => {
    clearTimeout(timer);
    timer = setTimeout(fn, 150);
  };
  window.addEventListener('resize', handler);
  return () => {
    clearTimeout(timer);
    window.removeEventListener('resize', handler);
  };
}

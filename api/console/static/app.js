// app.js: the devicehub console, a small single-page app over the public
// REST API and nothing else. Views (the route is the URL hash):
//   #/                 overview: counts and message volume per day / month
//   #/products         products, searched by name
//   #/devices          devices, searched by id or name, by product and state;
//                      an import of devices from a CSV or JSON file
//   #/device/<id>      a device: state, properties with live values (SSE),
//                      history and aggregate charts
//   #/product-new, #/product/<id>
//                      a product: create, edit, its thing model's properties
//                      as a form beside its JSON, deploy, undeploy
//   (new sections at the end: the platform's time zone, custom chart
//   ranges, product pages, a new device, a device's lifecycle, key,
//   property reads and function invokes)
//   #/users            users (administrators only): list, create, disable,
//                      enable, delete, assign roles, reset a password
//   #/audit            the audit trail of writes and logins (administrators)
//   #/alarms           alarms: active first by severity, filters, acknowledge
//                      and clear with a comment
//   #/account          the signed-in user: its roles and permissions, a
//                      change of its own password, its API keys
// What the signed-in user may not use (GET /api/authorize/me lists its
// permissions) is hidden; the server refuses it anyway (403).
// The login token lives in sessionStorage (one tab, gone with it).
'use strict';
(() => {
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
  // read them ("Meter 1, meter 2, Meter 10"), not in the order of their
  // bytes or of the database's collation: every list the console shows in
  // order is sorted here with byName or byId.
  const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: 'base' });
  const byId = (a, b) => collator.compare(a.id, b.id) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
  const byName = (a, b) => collator.compare(a.name || a.id, b.name || b.id) || byId(a, b);
  const count = (n) => Number(n).toLocaleString();

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

  const multi = (queries) => api('POST', '/api/dashboard/_multi', queries);

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

  // ---- lists (products, devices) ----------------------------------------

  // listView draws a searchable, paged table. opts: title, placeholder,
  // filters (extra controls), query(params) -> request body, columns
  // [{head, cell(item)}], emptyText(params), path, order (a compare
  // function: the rows of a page in the console's order; the pages are
  // cut in the server's order of the same field).
  function listView(view, params, opts) {
    const search = h('input', {
      type: 'search', id: opts.searchId, placeholder: opts.placeholder, value: params.get('q') || '',
      'aria-label': opts.placeholder,
    });
    const table = h('div', { class: 'table-wrap' });
    const pager = h('div', { class: 'pager' });
    view.append(
      h('div', { class: 'page-head' }, h('h1', {}, opts.title),
        h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); reload(0); } },
          search, opts.filters || [])),
      h('section', { class: 'card' }, table, pager),
    );
    let seq = 0;
    let timer = 0;
    async function reload(pageIndex) {
      params.set('q', search.value.trim());
      params.set('page', String(pageIndex));
      keepInURL(opts.path, params);
      const mine = ++seq;
      table.classList.add('loading');
      try {
        const body = opts.query(params);
        body.pageIndex = pageIndex;
        body.pageSize = PAGE_SIZE;
        const page = await api('POST', opts.endpoint, body);
        if (mine !== seq) return;
        draw(page);
      } catch (e) {
        if (mine !== seq) return;
        table.replaceChildren(errorBox(e, 'Could not load the list'));
        pager.replaceChildren();
      } finally {
        if (mine === seq) table.classList.remove('loading');
      }
    }
    function draw(page) {
      const data = (page.data || []).slice().sort(opts.order);
      if (data.length === 0) {
        table.replaceChildren(opts.emptyText(params));
        pager.replaceChildren();
        return;
      }
      table.replaceChildren(h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, opts.columns.map((c) => h('th', {}, c.head)))),
        h('tbody', {}, data.map((item) => h('tr', {}, opts.columns.map((c) => h('td', {}, c.cell(item))))))));
      const from = page.pageIndex * page.pageSize + 1;
      const to = from + data.length - 1;
      const total = page.totalExact === false ? `about ${count(page.total)}` : count(page.total);
      const last = to >= page.total && page.totalExact !== false;
      pager.replaceChildren(
        h('span', { class: 'muted' }, `${count(from)}–${count(to)} of ${total}`),
        h('button', { type: 'button', class: 'secondary', disabled: page.pageIndex === 0, onclick: () => reload(page.pageIndex - 1) }, '‹ Previous'),
        h('button', { type: 'button', class: 'secondary', disabled: last || data.length < page.pageSize, onclick: () => reload(page.pageIndex + 1) }, 'Next ›'),
      );
    }
    search.addEventListener('input', () => {
      clearTimeout(timer);
      timer = setTimeout(() => reload(0), 250);
    });
    reload(Number(params.get('page')) || 0);
    return { reload, leave: () => { clearTimeout(timer); seq++; } };
  }

  const like = (text) => '%' + text + '%';

  function productsView(view, params) {
    const v = listView(view, params, {
      title: 'Products', path: '/products', endpoint: '/api/device-product/_query', searchId: 'product-search',
      placeholder: 'Search products by name',
      query: (p) => ({
        sorts: [{ name: 'name', order: 'asc' }],
        terms: p.get('q') ? [{ column: 'name$like', value: like(p.get('q')) }] : [],
      }),
      order: byName,
      columns: [
        { head: 'Product', cell: (p) => [h('a', { href: '#/devices?product=' + encodeURIComponent(p.id), class: 'strong' }, p.name || p.id), h('div', { class: 'muted small mono' }, p.id)] },
        { head: 'State', cell: (p) => h('span', { class: p.state === 1 ? 'badge state-online' : 'badge state-notActive' }, p.state === 1 ? 'Deployed' : 'Not deployed') },
        { head: 'Devices', cell: (p) => h('a', { href: '#/devices?product=' + encodeURIComponent(p.id) }, count(p.deviceNum || 0)) },
        { head: 'Type', cell: (p) => (p.deviceType && (p.deviceType.text || p.deviceType.value)) || '' },
        { head: 'Classification', cell: (p) => p.classifiedName || p.classifiedId || '' },
        { head: 'Created', cell: (p) => when(p.createTime) },
        { head: 'Thing model', cell: (p) => h('a', { href: '#/product/' + encodeURIComponent(p.id), class: 'product-edit', 'data-product': p.id }, can('product:write') ? 'Edit' : 'View') },
      ],
      emptyText: (p) => p.get('q')
        ? empty(`No product name contains “${p.get('q')}”.`, 'Search looks for the text anywhere in the name.')
        : empty('No products yet.', 'Create one with POST /api/device/product (see README, Quick start), or run cmd/devicesim.'),
    });
    productButtons(view);
    return v;
  }

  function devicesView(view, params) {
    const stateSel = h('select', { id: 'device-state-filter', 'aria-label': 'State' },
      [['', 'Any state'], ['online', 'Online'], ['offline', 'Offline'], ['notActive', 'Not active']]
        .map(([v, t]) => h('option', { value: v, selected: params.get('state') === v }, t)));
    const product = params.get('product') || '';
    const chip = product
      ? h('span', { class: 'chip' }, 'Product ', h('b', {}, product), ' ',
        h('a', { href: '#/devices', title: 'Show the devices of every product', 'aria-label': 'Clear the product filter' }, '✕'))
      : null;
    const v = listView(view, params, {
      title: 'Devices', path: '/devices', endpoint: '/api/device-instance/_query', searchId: 'device-search',
      placeholder: 'Search devices by id or name', filters: [stateSel, chip],
      query: (p) => {
        const terms = [];
        const q = p.get('q');
        if (q) terms.push({ terms: [{ column: 'name$like', value: like(q) }, { column: 'id$like', value: like(q), type: 'or' }] });
        if (p.get('product')) terms.push({ column: 'productId', value: p.get('product') });
        if (p.get('state')) terms.push({ column: 'state', value: p.get('state') });
        return { sorts: [{ name: 'id', order: 'asc' }], terms };
      },
      order: () => 0, // the server's order, page after page (deviceListExtras says so)
      columns: [
        { head: 'Device', cell: (d) => [h('a', { href: '#/device/' + encodeURIComponent(d.id), class: 'strong device-link', 'data-id': d.id }, d.name || d.id), h('div', { class: 'muted small mono' }, d.id)] },
        { head: 'Product', cell: (d) => h('a', { href: '#/devices?product=' + encodeURIComponent(d.productId) }, d.productName || d.productId) },
        { head: 'State', cell: (d) => stateBadge(d.state) },
        { head: 'Created', cell: (d) => when(d.createTime) },
        { head: 'Registered', cell: (d) => when(d.registryTime) },
      ],
      emptyText: (p) => (p.get('q') || p.get('state') || p.get('product'))
        ? empty('No device matches these filters.', 'Search looks for the text anywhere in the id or the name.')
        : empty('No devices yet.', 'Create one with POST /api/device/instance, or run cmd/devicesim (README).'),
    });
    stateSel.addEventListener('change', () => {
      params.set('state', stateSel.value);
      v.reload(0);
    });
    deviceListExtras(view, product, () => v.reload(Number(params.get('page')) || 0));
    if (!can('device:write')) return v; // no import for who may not create devices
    const imp = importForm(product, () => v.reload(0));
    const toggle = h('button', { type: 'button', id: 'import-open', class: 'secondary', 'aria-expanded': 'false',
      onclick: () => {
        imp.card.hidden = !imp.card.hidden;
        toggle.setAttribute('aria-expanded', String(!imp.card.hidden));
        if (!imp.card.hidden) imp.open();
      } }, 'Import devices');
    $('.page-head', view).append(toggle);
    view.insertBefore(imp.card, $('.page-head', view).nextSibling);
    return { reload: v.reload, leave: () => { v.leave(); imp.leave(); } };
  }

  // ---- users (administrators) -------------------------------------------

  // usersView lists the users (POST /api/user/_query) with a form to
  // create one and, per user, buttons to disable or enable it, change its
  // roles (those of POST /api/role/_query), reset its password and delete
  // it. The server refuses leaving no administrator (400): its message is
  // shown.
  function usersView(view, params) {
    const note = h('p', { id: 'users-note', role: 'status', class: 'muted' });
    const say = (text, isError) => { note.textContent = text; note.className = isError ? 'error' : 'muted'; };
    let roles = []; // [{id, name}], in the console's order
    const roleName = (id) => (roles.find((r) => r.id === id) || { name: id }).name;
    const act = async (what, fn) => {
      try {
        await fn();
        say(what);
        v.reload(Number(params.get('page')) || 0);
      } catch (e) {
        say(describe(e), true);
      }
    };
    // editRoles swaps a user's roles cell for a checkbox per role, saved
    // with PUT /api/user/{id} {roles}.
    const editRoles = (u, cell) => {
      const boxes = roles.map((r) => h('label', { class: 'check' },
        h('input', { type: 'checkbox', value: r.id, checked: (u.roles || []).includes(r.id), 'data-role': r.id }), ' ', r.name));
      cell.replaceChildren(h('form', { class: 'roles-form', 'data-user': u.username,
        onsubmit: (e) => {
          e.preventDefault();
          const chosen = [...cell.querySelectorAll('input[type=checkbox]:checked')].map((b) => b.value);
          act(`Roles of ${u.username} saved.`, () => api('PUT', '/api/user/' + encodeURIComponent(u.id), { roles: chosen }));
        } }, boxes, ' ',
      h('button', { type: 'submit', 'data-action': 'save-roles' }, 'Save'), ' ',
      h('button', { type: 'button', class: 'secondary', onclick: () => v.reload(Number(params.get('page')) || 0) }, 'Cancel')));
    };
    const v = listView(view, params, {
      title: 'Users', path: '/users', endpoint: '/api/user/_query', searchId: 'user-search',
      placeholder: 'Search users by user name or name',
      query: (p) => {
        const q = p.get('q');
        const terms = q ? [{ terms: [{ column: 'username$like', value: like(q) }, { column: 'name$like', value: like(q), type: 'or' }] }] : [];
        return { sorts: [{ name: 'username', order: 'asc' }], terms };
      },
      order: (a, b) => collator.compare(a.username, b.username),
      columns: [
        { head: 'User', cell: (u) => [h('span', { class: 'strong' }, u.username), h('div', { class: 'muted small' }, u.name)] },
        { head: 'Roles', cell: (u) => h('span', { class: 'user-roles', 'data-user': u.username }, (u.roles || []).map(roleName).join(', ') || '–') },
        { head: 'State', cell: (u) => stateBadge(u.state) },
        { head: 'Created', cell: (u) => when(u.createTime) },
        { head: '', cell: (u) => {
          const enabled = (u.state && u.state.value) === 'enabled';
          return [
            h('button', { type: 'button', class: 'secondary', 'data-action': enabled ? 'disable' : 'enable', 'data-user': u.username,
              onclick: () => act(`${u.username} ${enabled ? 'disabled' : 'enabled'}.`,
                () => api('PUT', '/api/user/' + encodeURIComponent(u.id), { state: enabled ? 'disabled' : 'enabled' })) },
            enabled ? 'Disable' : 'Enable'),
            ' ',
            h('button', { type: 'button', class: 'secondary', 'data-action': 'roles', 'data-user': u.username,
              onclick: (e) => editRoles(u, e.target.closest('tr').querySelector('.user-roles')) }, 'Roles'),
            ' ',
            h('button', { type: 'button', class: 'secondary', 'data-action': 'password', 'data-user': u.username,
              onclick: () => {
                const pw = prompt(`New password for ${u.username} (at least 8 characters). Their sessions and API keys end.`);
                if (pw) act(`Password of ${u.username} reset.`, () => api('PUT', '/api/user/' + encodeURIComponent(u.id) + '/password', { password: pw }));
              } }, 'Reset password'),
            ' ',
            h('button', { type: 'button', class: 'secondary', 'data-action': 'delete', 'data-user': u.username,
              onclick: () => {
                if (confirm(`Delete user ${u.username}?`)) act(`${u.username} deleted.`, () => api('DELETE', '/api/user/' + encodeURIComponent(u.id)));
              } }, 'Delete'),
          ];
        } },
      ],
      emptyText: () => empty('No user matches.'),
    });
    const username = h('input', { id: 'new-user-username', required: true, autocomplete: 'off', 'aria-label': 'User name', placeholder: 'User name' });
    const name = h('input', { id: 'new-user-name', autocomplete: 'off', 'aria-label': 'Name', placeholder: 'Name (optional)' });
    const password = h('input', { id: 'new-user-password', type: 'password', required: true, minlength: '8', autocomplete: 'new-password', 'aria-label': 'Password', placeholder: 'Password (8+)' });
    const role = h('select', { id: 'new-user-role', 'aria-label': 'Role', required: true });
    const form = h('form', { class: 'card filters', id: 'new-user',
      onsubmit: (e) => {
        e.preventDefault();
        act(`User ${username.value.trim()} created.`, async () => {
          await api('POST', '/api/user', { username: username.value.trim(), name: name.value.trim(), password: password.value, roles: [role.value] });
          form.reset();
        });
      } }, username, name, password, role, h('button', { type: 'submit', id: 'new-user-submit' }, 'Create user'));
    view.insertBefore(form, $('.page-head', view).nextSibling);
    view.insertBefore(note, form.nextSibling);
    // The roles to choose from: the server's (built-in and any others).
    api('POST', '/api/role/_query', { paging: false, sorts: [{ name: 'name', order: 'asc' }] }).then((page) => {
      roles = (page.data || []).slice().sort(byName);
      role.replaceChildren(...roles.map((r) => h('option', { value: r.id, selected: r.id === 'viewer' }, r.name)));
      v.reload(Number(params.get('page')) || 0); // role names in the list
    }, (e) => say('Could not load the roles: ' + describe(e), true));
    return v;
  }

  // ---- audit trail (administrators) -----------------------------------------

  // auditView lists the audit trail (POST /api/audit/_query), newest
  // first, searched by user name, route or object id.
  function auditView(view, params) {
    return listView(view, params, {
      title: 'Audit trail', path: '/audit', endpoint: '/api/audit/_query', searchId: 'audit-search',
      placeholder: 'Search by user, route or object',
      query: (p) => {
        const q = p.get('q');
        const terms = q ? [{ terms: [{ column: 'username$like', value: like(q) }, { column: 'route$like', value: like(q), type: 'or' },
          { column: 'objectId$like', value: like(q), type: 'or' }] }] : [];
        return { sorts: [{ name: 'time', order: 'desc' }], terms };
      },
      order: (a, b) => b.time - a.time || b.id - a.id,
      columns: [
        { head: 'Time', cell: (e) => when(e.time) },
        { head: 'User', cell: (e) => [h('span', { class: 'strong' }, e.username || '–'), h('div', { class: 'muted small' }, e.address)] },
        { head: 'Request', cell: (e) => h('span', { class: 'mono audit-route' }, e.method + ' ' + e.route) },
        { head: 'Object', cell: (e) => h('span', { class: 'mono' }, e.objectId || '') },
        { head: 'Outcome', cell: (e) => h('span', { class: 'badge ' + (e.status < 400 ? 'state-online' : 'state-notActive'), 'data-status': e.status },
          e.status + (e.code ? ' ' + e.code : '')) },
      ],
      emptyText: (p) => p.get('q') ? empty('No entry matches.') : empty('Nothing audited yet.', 'Writes and logins show here.'),
    });
  }

  // ---- alarms ---------------------------------------------------------------

  // alarmsView lists the alarms of the caller's products (#/alarms):
  // active ones by default, the most severe first on each page; filters
  // by state and severity; acknowledge and clear with a comment (who may:
  // alarm:write). A device's alarms: #/alarms?device=<id>.
  const SEVERITIES = ['critical', 'major', 'minor', 'warning', 'info'];
  function alarmsView(view, params) {
    if (!params.has('state')) params.set('state', 'active');
    const stateSel = h('select', { id: 'alarm-state-filter', 'aria-label': 'State' },
      [['active', 'Active'], ['cleared', 'Cleared'], ['any', 'Any state']]
        .map(([v, t]) => h('option', { value: v, selected: params.get('state') === v }, t)));
    const sevSel = h('select', { id: 'alarm-severity-filter', 'aria-label': 'Severity' },
      [['', 'Any severity'], ...SEVERITIES.map((s) => [s, s])]
        .map(([v, t]) => h('option', { value: v, selected: (params.get('severity') || '') === v }, t)));
    const device = params.get('device') || '';
    const chip = device
      ? h('span', { class: 'chip' }, 'Device ', h('b', {}, device), ' ',
        h('a', { href: '#/alarms', title: 'Show the alarms of every device', 'aria-label': 'Clear the device filter' }, '✕'))
      : null;
    const handle = (a, action) => async () => {
      const comment = window.prompt((action === '_ack' ? 'Acknowledge' : 'Clear') + ' the alarm of ' + a.deviceId + ' (' + a.ruleName + '). Comment:', '');
      if (comment === null) return;
      try {
        await api('POST', '/api/alarm/record/' + encodeURIComponent(a.id) + '/' + action, { comment });
        v.reload(Number(params.get('page') || 0));
      } catch (e) {
        window.alert(describe(e));
      }
    };
    const v = listView(view, params, {
      title: 'Alarms', path: '/alarms', endpoint: '/api/alarm/record/_query', searchId: 'alarm-search',
      placeholder: 'Search by device or rule id', filters: [stateSel, sevSel, chip],
      query: (p) => {
        const terms = [];
        const q = p.get('q');
        if (q) terms.push({ terms: [{ column: 'deviceId$like', value: like(q) }, { column: 'ruleId$like', value: like(q), type: 'or' }] });
        if (p.get('state') && p.get('state') !== 'any') terms.push({ column: 'state', value: p.get('state') });
        if (p.get('severity')) terms.push({ column: 'severity', value: p.get('severity') });
        if (p.get('device')) terms.push({ column: 'deviceId', value: p.get('device') });
        return { terms };
      },
      order: (a, b) => (a.state === b.state ? 0 : a.state === 'active' ? -1 : 1) || b.severityRank - a.severityRank || b.raisedTime - a.raisedTime,
      columns: [
        { head: 'Severity', cell: (a) => h('span', { class: 'badge severity-' + a.severity, 'data-severity': a.severity }, a.severity) },
        { head: 'Device', cell: (a) => h('a', { href: '#/device/' + encodeURIComponent(a.deviceId), class: 'strong alarm-device' }, a.deviceId) },
        { head: 'Rule', cell: (a) => [h('span', {}, a.ruleName), h('div', { class: 'muted small mono' }, a.ruleId)] },
        { head: 'State', cell: (a) => [h('span', { class: 'alarm-state' }, a.state + (a.acknowledged ? ', acknowledged' : '')),
          h('div', { class: 'muted small' }, a.acknowledged ? (a.acknowledgedBy + (a.ackComment ? ': ' + a.ackComment : '')) : ''),
          a.state === 'cleared' ? h('div', { class: 'muted small' }, 'cleared ' + (a.clearedBy ? 'by ' + a.clearedBy : 'by ' + a.clearValue)) : ''] },
        { head: 'Count', cell: (a) => h('span', { class: 'alarm-count' }, String(a.count)) },
        { head: 'Last value', cell: (a) => [h('span', { class: 'mono' }, a.lastValue), h('div', { class: 'muted small' }, when(a.lastTime))] },
        { head: 'Raised', cell: (a) => when(a.raisedTime) },
        { head: '', cell: (a) => can('alarm:write') && a.state === 'active' ? [
          a.acknowledged ? '' : h('button', { type: 'button', class: 'secondary alarm-ack', onclick: handle(a, '_ack') }, 'Acknowledge'), ' ',
          h('button', { type: 'button', class: 'secondary alarm-clear', onclick: handle(a, '_clear') }, 'Clear')] : '' },
      ],
      emptyText: (p) => p.get('state') === 'active' && !p.get('q') && !p.get('severity')
        ? empty('No active alarm.', 'Alarm rules: POST /api/alarm/config (README, Alarms).')
        : empty('No alarm matches these filters.'),
    });
    for (const [sel, key] of [[stateSel, 'state'], [sevSel, 'severity']]) {
      sel.addEventListener('change', () => {
        params.set(key, sel.value);
        v.reload(0);
      });
    }
    return v;
  }

  // deviceAlarms adds a device's active alarms to its page, after head.
  function deviceAlarms(view, head, id) {
    const card = h('section', { class: 'card', id: 'device-alarms' },
      h('div', { class: 'card-head' }, h('h2', {}, 'Active alarms'),
        h('a', { href: '#/alarms?state=any&device=' + encodeURIComponent(id) }, 'All of its alarms')),
      h('p', { class: 'muted small' }, 'Loading…'));
    view.insertBefore(card, head.nextSibling);
    api('POST', '/api/alarm/record/_query', { pageSize: 50, terms: [{ column: 'deviceId', value: id }, { column: 'state', value: 'active' }] })
      .then((page) => {
        const data = (page.data || []).slice().sort((a, b) => b.severityRank - a.severityRank);
        card.lastChild.replaceWith(data.length === 0 ? h('p', { class: 'muted small' }, 'None.')
          : h('ul', { class: 'alarm-list' }, data.map((a) => h('li', {},
            h('span', { class: 'badge severity-' + a.severity }, a.severity), ' ', a.ruleName, ': ',
            h('span', { class: 'mono' }, a.lastValue), h('span', { class: 'muted small' }, ' ×' + a.count + ', since ' + when(a.raisedTime))))));
      }, (e) => card.lastChild.replaceWith(errorBox(e, 'Could not load its alarms')));
  }

  // ---- the signed-in user's account ---------------------------------------

  // accountView shows the signed-in user's roles and permissions and a
  // form to change its own password (PUT /api/user/passwd, with the
  // current one); its other sessions and its API keys end, this one stays.
  function accountView(view) {
    const note = h('p', { id: 'password-note', role: 'status', class: 'muted' });
    const old = h('input', { id: 'password-old', type: 'password', required: true, autocomplete: 'current-password', 'aria-label': 'Current password', placeholder: 'Current password' });
    const pw = h('input', { id: 'password-new', type: 'password', required: true, minlength: '8', autocomplete: 'new-password', 'aria-label': 'New password', placeholder: 'New password (8+)' });
    const again = h('input', { id: 'password-again', type: 'password', required: true, minlength: '8', autocomplete: 'new-password', 'aria-label': 'New password again', placeholder: 'New password again' });
    const submit = h('button', { type: 'submit', id: 'password-submit' }, 'Change password');
    const form = h('form', { class: 'filters', id: 'password-form',
      onsubmit: async (e) => {
        e.preventDefault();
        if (pw.value !== again.value) {
          note.textContent = 'The new passwords differ.';
          note.className = 'error';
          return;
        }
        submit.disabled = true;
        try {
          await api('PUT', '/api/user/passwd', { oldPassword: old.value, newPassword: pw.value });
          form.reset();
          note.textContent = 'Password changed. Your other sessions and your API keys have ended.';
          note.className = 'muted';
        } catch (err) {
          note.textContent = describe(err);
          note.className = 'error';
        } finally {
          submit.disabled = false;
        }
      } }, old, pw, again, submit);
    view.append(
      h('div', { class: 'page-head' }, h('h1', {}, 'Your account')),
      h('section', { class: 'card', id: 'account' },
        h('p', {}, h('span', { class: 'strong', id: 'account-username' }, me.username), me.name && me.name !== me.username ? ' – ' + me.name : ''),
        h('p', { class: 'muted small' }, 'Roles: ', h('span', { id: 'account-roles' }, (me.roles || []).join(', ') || 'none')),
        h('p', { class: 'muted small' }, 'Permissions: ', h('span', { id: 'account-permissions', class: 'mono' }, (me.permissions || []).join(', ') || 'none'))),
      h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Change your password')), form, note),
    );
    if (me.keyId) return {}; // signed in with an API key: no keys of keys
    return keysCard(view);
  }

  // keysCard lists the signed-in user's API keys (POST /api/user/key/_query)
  // with a form to make one (a subset of the user's permissions, optional
  // products and expiry; its secret is shown once) and a button to revoke
  // each (DELETE /api/user/key/{id}).
  function keysCard(view) {
    const note = h('p', { id: 'keys-note', role: 'status', class: 'muted' });
    const say = (text, isError) => { note.textContent = text; note.className = isError ? 'error' : 'muted'; };
    const secret = h('div', { id: 'key-secret', hidden: true });
    const list = h('div', { class: 'table-wrap', id: 'keys-list' });
    const name = h('input', { id: 'new-key-name', required: true, autocomplete: 'off', 'aria-label': 'Key name', placeholder: 'Name, e.g. grafana' });
    const perms = (me.permissions || []).map((p) => h('label', { class: 'check' },
      h('input', { type: 'checkbox', value: p, 'data-permission': p }), ' ', h('span', { class: 'mono' }, p)));
    const products = h('input', { id: 'new-key-products', autocomplete: 'off', 'aria-label': 'Products', placeholder: 'Products (ids, comma-separated; empty: all of yours)' });
    const expires = h('input', { id: 'new-key-expires', type: 'date', 'aria-label': 'Expires on (optional)', title: 'Expires on (optional)' });
    const form = h('form', { class: 'roles-form', id: 'new-key',
      onsubmit: async (e) => {
        e.preventDefault();
        const chosen = [...form.querySelectorAll('input[data-permission]:checked')].map((b) => b.value);
        if (!chosen.length) return say('Choose at least one permission.', true);
        const body = { name: name.value.trim(), permissions: chosen };
        const ids = products.value.split(',').map((x) => x.trim()).filter(Boolean);
        if (ids.length) body.products = ids;
        if (expires.value) body.expiresAt = new Date(expires.value + 'T23:59:59').getTime();
        try {
          const k = await api('POST', '/api/user/key', body);
          form.reset();
          say(`Key ${k.name} created.`);
          secret.hidden = false;
          secret.replaceChildren(h('p', { class: 'strong' }, 'Copy the key now: it is not shown again.'),
            h('code', { id: 'key-secret-value' }, k.key));
          load();
        } catch (err) {
          say(describe(err), true);
        }
      } }, name, perms, products, expires, h('button', { type: 'submit', id: 'new-key-submit' }, 'Create key'));
    async function load() {
      try {
        const page = await api('POST', '/api/user/key/_query', { paging: false, terms: [{ column: 'userId', value: me.id }] });
        const keys = page.data || [];
        if (!keys.length) {
          list.replaceChildren(empty('No API keys.', 'A program sends a key as its X-Access-Token.'));
          return;
        }
        list.replaceChildren(h('table', { class: 'list' },
          h('thead', {}, h('tr', {}, ['Key', 'Permissions', 'Products', 'Expires', 'Last used', ''].map((c) => h('th', {}, c)))),
          h('tbody', {}, keys.map((k) => h('tr', { 'data-key': k.name },
            h('td', {}, h('span', { class: 'strong' }, k.name), h('div', { class: 'muted small' }, 'created ' + when(k.createTime))),
            h('td', { class: 'mono small' }, (k.permissions || []).map((p) => p.value || p).join(', ')),
            h('td', { class: 'small' }, k.products ? k.products.join(', ') : 'yours'),
            h('td', {}, k.expiresAt ? when(k.expiresAt) : 'never'),
            h('td', { class: 'key-last-used' }, k.lastUsed ? when(k.lastUsed) : 'never'),
            h('td', {}, h('button', { type: 'button', class: 'secondary', 'data-action': 'revoke', 'data-key': k.name,
              onclick: async () => {
                if (!confirm(`Revoke key ${k.name}? Programs using it are refused at once.`)) return;
                try {
                  await api('DELETE', '/api/user/key/' + encodeURIComponent(k.id));
                  say(`Key ${k.name} revoked.`);
                  load();
                } catch (err) {
                  say(describe(err), true);
                }
              } }, 'Revoke')))))));
      } catch (err) {
        list.replaceChildren(errorBox(err, 'Could not load your keys'));
      }
    }
    view.append(h('section', { class: 'card', id: 'keys' },
      h('div', { class: 'card-head' }, h('h2', {}, 'Your API keys'),
        h('span', { class: 'muted small' }, 'For programs: each holds some of your permissions, never more than you hold.')),
      form, note, secret, list));
    load();
    return {};
  }

  // ---- device import ----------------------------------------------------

  // importForm uploads a CSV (or JSON) file of devices into one product
  // (POST /api/device/instance/{productId}/import, multipart), showing the
  // upload's progress, then the devices created or the rows refused. The
  // generated keys are shown only in that answer: the form offers them as
  // a CSV download.
  function importForm(preselect, done) {
    const productSel = h('select', { id: 'import-product', required: true, 'aria-label': 'Product' },
      h('option', { value: '' }, 'Choose a product'));
    const file = h('input', { type: 'file', id: 'import-file', required: true, accept: '.csv,.json,text/csv,application/json' });
    const deploy = h('input', { type: 'checkbox', id: 'import-deploy' });
    const submit = h('button', { type: 'submit', id: 'import-submit' }, 'Import');
    const progress = h('progress', { id: 'import-progress', max: '100', value: '0', hidden: true });
    const status = h('p', { id: 'import-status', class: 'muted', role: 'status' });
    const result = h('div', { id: 'import-result' });
    const form = h('form', { id: 'import-form', class: 'import-form', onsubmit: (e) => { e.preventDefault(); send(); } },
      h('label', {}, 'Product ', productSel),
      h('label', {}, 'File ', file),
      h('label', { class: 'check' }, deploy, ' Deploy them (ready to connect)'),
      submit);
    const card = h('section', { class: 'card', id: 'import-card', hidden: true },
      h('div', { class: 'card-head' }, h('h2', {}, 'Import devices'),
        h('span', { class: 'muted small' }, 'CSV with a header row: id, name (required), secureId, secureKey, description, photoUrl, orgId, storePolicy, edge, mediaDevice; up to 10,000 devices. All or nothing.')),
      form, progress, status, result);
    let xhr = null;
    let loaded = false;
    let url = '';

    async function open() {
      if (loaded) return;
      loaded = true;
      try {
        const page = await api('POST', '/api/device-product/_query', { pageSize: 500, sorts: [{ name: 'name', order: 'asc' }] });
        for (const p of (page.data || []).slice().sort(byName)) {
          productSel.append(h('option', { value: p.id, selected: p.id === preselect }, `${p.name || p.id} (${p.id})${p.state === 1 ? '' : ' – not deployed'}`));
        }
      } catch (e) {
        loaded = false;
        status.textContent = 'Could not load the products: ' + describe(e);
      }
    }

    function send() {
      if (!productSel.value || !file.files.length) return;
      const body = new FormData();
      body.append('file', file.files[0]);
      const path = `/api/device/instance/${encodeURIComponent(productSel.value)}/import` + (deploy.checked ? '?deploy=true' : '');
      const token = sessionStorage.getItem(TOKEN);
      xhr = new XMLHttpRequest();
      xhr.open('POST', path);
      if (token) xhr.setRequestHeader('X-Access-Token', token);
      xhr.setRequestHeader('Accept', 'application/json');
      submit.disabled = true;
      status.className = 'muted';
      result.replaceChildren();
      progress.hidden = false;
      progress.value = 0;
      progress.dataset.phase = 'upload';
      status.textContent = 'Uploading…';
      xhr.upload.addEventListener('progress', (e) => {
        if (e.lengthComputable) progress.value = Math.round((e.loaded / e.total) * 100);
      });
      xhr.upload.addEventListener('load', () => {
        progress.removeAttribute('value'); // indeterminate while devicehub stores them
        progress.dataset.phase = 'store';
        status.textContent = 'Uploaded; storing the devices…';
      });
      xhr.addEventListener('load', () => {
        let env = null;
        try {
          env = JSON.parse(xhr.responseText);
        } catch (e) {
          env = null;
        }
        finish(xhr.status, env);
      });
      xhr.addEventListener('error', () => finish(0, null));
      xhr.send(body);
    }

    function finish(httpStatus, env) {
      xhr = null;
      submit.disabled = false;
      progress.value = 100;
      progress.dataset.phase = 'done';
      if (httpStatus === 401 && sessionStorage.getItem(TOKEN)) {
        signOut('Your session has expired: sign in again.');
        return;
      }
      const res = env && env.result;
      if (httpStatus === 200 && res) {
        status.textContent = `Imported ${count(res.total)} devices${res.deployed ? ', deployed' : ''}.`;
        status.className = 'ok-text';
        result.replaceChildren(keysLink(res.devices || []));
        file.value = '';
        done();
        return;
      }
      status.className = 'error';
      status.textContent = env ? `${env.message} (${env.code || 'HTTP ' + httpStatus})` : 'devicehub did not answer';
      if (Array.isArray(res) && res.length) {
        result.replaceChildren(h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'import-errors' },
          h('thead', {}, h('tr', {}, ['Row', 'Id', 'Field', 'Problem'].map((t) => h('th', {}, t)))),
          h('tbody', {}, res.map((r) => h('tr', { 'data-row': r.row },
            h('td', {}, String(r.row)), h('td', { class: 'mono' }, r.id), h('td', { class: 'mono' }, r.field), h('td', {}, r.reason)))))));
      } else if (res && res.devices) { // stored, but the broker was late: the keys still come
        result.replaceChildren(keysLink(res.devices));
      }
    }

    // keysLink offers the created devices' logins as a CSV file: the keys
    // are not shown again.
    function keysLink(devices) {
      if (url) URL.revokeObjectURL(url);
      const text = 'id,secureId,secureKey\r\n' + devices.map((d) => [d.id, d.secureId, d.secureKey].map(csvCell).join(',')).join('\r\n') + '\r\n';
      url = URL.createObjectURL(new Blob([text], { type: 'text/csv' }));
      return h('p', {}, h('a', { href: url, download: 'device-logins.csv', id: 'import-keys' }, 'Download the devices\' logins (CSV)'),
        h('span', { class: 'muted small' }, ' – their keys are shown only now.'));
    }

    return {
      card, open,
      leave: () => {
        if (xhr) xhr.abort();
        if (url) URL.revokeObjectURL(url);
      },
    };
  }

  // ---- overview ---------------------------------------------------------

  const PERIODS = {
    day: { text: 'Per day', caption: 'last 30 days', params: { time: '1d', format: 'yyyy-MM-dd', limit: 30, from: 'now-29d/d', to: 'now' }, label: (s) => s.slice(5) },
    month: { text: 'Per month', caption: 'last 12 months', params: { time: '1M', format: 'yyyy-MM', limit: 12, from: 'now-11M/M', to: 'now' }, label: (s) => s },
  };

  function overviewView(view) {
    const tiles = h('div', { class: 'tiles' });
    const chart = h('div', { class: 'chart', id: 'volume-chart' });
    const caption = h('p', { class: 'muted small', id: 'volume-caption' });
    const productSel = h('select', { id: 'volume-product', 'aria-label': 'Product' }, h('option', { value: '' }, 'All products'));
    let period = 'day';
    let items = null;
    const buttons = Object.entries(PERIODS).map(([key, p]) =>
      h('button', { type: 'button', class: 'seg', 'data-period': key, 'aria-pressed': String(key === period), onclick: () => { period = key; load(); } }, p.text));
    view.append(
      h('div', { class: 'page-head' }, h('h1', {}, 'Overview')),
      tiles,
      h('section', { class: 'card' },
        h('div', { class: 'card-head' }, h('h2', {}, 'Message volume'),
          h('div', { class: 'controls' }, h('div', { class: 'segs', role: 'group', 'aria-label': 'Period' }, buttons), productSel)),
        caption, chart),
    );

    let seq = 0;
    async function load() {
      buttons.forEach((b) => b.setAttribute('aria-pressed', String(b.dataset.period === period)));
      const p = PERIODS[period];
      const params = Object.assign({}, p.params);
      if (productSel.value) params.productId = productSel.value;
      const mine = ++seq;
      chart.classList.add('loading');
      try {
        const res = await multi([{ dashboard: 'device', object: 'message', measurement: 'quantity', dimension: 'agg', group: 'volume', params }]);
        if (mine !== seq) return;
        items = res.slice().reverse(); // newest first from the API; oldest left on screen
        draw();
      } catch (e) {
        if (mine !== seq) return;
        items = null;
        caption.textContent = '';
        chart.replaceChildren(errorBox(e, 'Could not load message counts'));
      } finally {
        if (mine === seq) chart.classList.remove('loading');
      }
    }
    function draw() {
      if (!items) return;
      const p = PERIODS[period];
      const total = items.reduce((s, i) => s + i.data.value, 0);
      const busiest = items.reduce((b, i) => (i.data.value > (b ? b.data.value : 0) ? i : b), null);
      caption.textContent = `Messages received from and sent to devices ${productSel.value ? 'of ' + productSel.value + ' ' : ''}` +
        `${period === 'day' ? 'per day' : 'per month'}, ${p.caption}: ${count(total)} in all` +
        (busiest ? `, most on ${busiest.data.timeString} (${count(busiest.data.value)}).` : '.');
      chart.replaceChildren(Chart.bars(items.map((i) => ({
        label: p.label(i.data.timeString), value: i.data.value,
        title: `${i.data.timeString}: ${count(i.data.value)} messages`,
      })), { width: chart.clientWidth, integer: true, label: 'Messages ' + (period === 'day' ? 'per day' : 'per month') }));
      if (total === 0) chart.append(h('p', { class: 'muted small center' }, 'No messages in this period.'));
    }
    productSel.addEventListener('change', load);

    // Counts: products, devices, devices online.
    const tile = (label, href) => {
      const n = h('div', { class: 'tile-n' }, '…');
      tiles.append(h('a', { class: 'tile', href }, n, h('div', { class: 'muted' }, label)));
      return n;
    };
    const nProducts = tile('products', '#/products');
    const nDevices = tile('devices', '#/devices');
    const nOnline = tile('devices online', '#/devices?state=online');
    const show = (el, promise) => promise.then((v) => { el.textContent = count(v); }, (e) => { el.textContent = '?'; el.title = describe(e); });
    show(nProducts, api('POST', '/api/device-product/_count', {}));
    show(nDevices, api('POST', '/api/device-instance/_query', { pageSize: 1 }).then((p) => p.total));
    show(nOnline, api('POST', '/api/device-instance/_query', { pageSize: 1, terms: [{ column: 'state', value: 'online' }] }).then((p) => p.total));
    api('POST', '/api/device-product/_query', { pageSize: 200, sorts: [{ name: 'name', order: 'asc' }] }).then((page) => {
      for (const p of (page.data || []).slice().sort(byName)) productSel.append(h('option', { value: p.id }, p.name ? `${p.name} (${p.id})` : p.id));
    }, () => {});

    load();
    const stop = onResize(draw);
    return { leave: () => { seq++; stop(); } };
  }

  // ---- device -----------------------------------------------------------

  // formatValue renders a value with the property's thing model, as the
  // API's formatValue does: unit, scale, enum and boolean texts.
  function formatValue(prop, v) {
    if (v === null || v === undefined) return '';
    const vt = (prop && prop.valueType) || {};
    const text = typeof v === 'object' ? JSON.stringify(v) : String(v);
    switch (vt.type) {
      case 'int': case 'long': case 'float': case 'double': {
        const n = Number(v);
        if (!isFinite(n)) return text;
        let s = text;
        if ((vt.type === 'float' || vt.type === 'double') && Number.isInteger(vt.scale) && vt.scale >= 0 && vt.scale <= 10) s = n.toFixed(vt.scale);
        const unit = UNITS[vt.unit] || '';
        return unit === '' ? s : unit === '%' ? s + '%' : s + ' ' + unit;
      }
      case 'enum': {
        const e = (vt.elements || []).find((x) => String(x.value) === text);
        return e ? e.text : text;
      }
      case 'boolean': {
        const t = vt.trueText || 'true';
        const f = vt.falseText || 'false';
        if (vt.trueValue !== undefined && text === String(vt.trueValue)) return t;
        if (vt.falseValue !== undefined && text === String(vt.falseValue)) return f;
        return text === 'true' || text === '1' ? t : text === 'false' || text === '0' ? f : text;
      }
      case 'date': {
        const n = Number(v);
        return isFinite(n) ? when(n) : text;
      }
    }
    return text;
  }

  function typeText(prop) {
    const vt = prop.valueType || {};
    const unit = UNITS[vt.unit];
    return (vt.type || '?') + (unit ? ` (${unit})` : '');
  }

  const CHART_MODES = {
    history: { text: 'Latest 100 values' },
    '5m': { text: 'Every 5 minutes, last 2 hours', params: { time: '5m', limit: 24, from: 'now-115m/m', to: 'now' }, label: (s) => s.slice(11) },
    '1h': { text: 'Hourly, last 24 hours', params: { time: '1h', limit: 24, from: 'now-23h/h', to: 'now' }, label: (s) => s.slice(11) },
    '1d': { text: 'Daily, last 30 days', params: { time: '1d', limit: 30, from: 'now-29d/d', to: 'now' }, label: (s) => s.slice(5, 10) },
    '1M': { text: 'Monthly, last 12 months', params: { time: '1M', limit: 12, from: 'now-11M/M', to: 'now' }, label: (s) => s.slice(0, 7) },
  };
  const AGGS = { avg: 'Average', min: 'Minimum', max: 'Maximum', sum: 'Sum', count: 'Count', last: 'Last value' };

  function deviceView(view, id) {
    let closed = false;
    let es = null;
    let device = null;
    let props = [];
    const rows = new Map(); // property id -> {value, time} cells
    const head = h('section', { class: 'card', id: 'device-head' }, h('p', { class: 'muted' }, 'Loading the device…'));
    const propsBody = h('div', { class: 'table-wrap', id: 'device-properties' });
    const chartCard = h('section', { class: 'card', id: 'device-chart-card' });
    const shadowSection = h('section', { class: 'card', id: 'device-shadow' });
    const live = h('span', { class: 'live', id: 'live-status' }, 'Live updates: connecting…');
    const notes = h('p', { class: 'muted small', id: 'live-notes' });
    view.append(
      h('p', { class: 'crumbs' }, h('a', { href: '#/devices' }, 'Devices'), ' › ', h('span', { id: 'crumb' }, id)),
      head,
      h('section', { class: 'card' },
        h('div', { class: 'card-head' }, h('h2', {}, 'Properties'), live),
        h('p', { class: 'muted small' }, 'The latest value of each property of the thing model; new values appear as the device reports them.'),
        propsBody, notes),
      chartCard,
      shadowSection,
    );

    const chart = deviceChart(chartCard, () => device, () => props);
    if (can('alarm:read')) deviceAlarms(view, head, id);
    const shadow = shadowCard(shadowSection, () => device, () => props);

    api('GET', `/api/device/instance/${encodeURIComponent(id)}/detail`).then((d) => {
      if (closed) return;
      device = d;
      let model = {};
      try {
        model = d.metadata ? JSON.parse(d.metadata) : {};
      } catch (e) {
        model = {};
      }
      props = Array.isArray(model.properties) ? model.properties.filter((p) => p && p.id) : [];
      drawHead();
      deviceManage(view, d, props, model, route);
      drawProperties();
      chart.setup();
      shadow.load();
      loadLatest();
      connect();
    }, (e) => {
      if (closed) return;
      head.replaceChildren(errorBox(e, `Could not load device ${id}`));
      propsBody.replaceChildren();
      live.textContent = '';
    });

    function drawHead() {
      const d = device;
      const dl = h('dl', { class: 'facts' });
      const fact = (k, v) => dl.append(h('dt', {}, k), h('dd', {}, v));
      fact('ID', h('span', { class: 'mono' }, d.id));
      fact('Product', h('a', { href: '#/devices?product=' + encodeURIComponent(d.productId) }, d.productName ? `${d.productName} (${d.productId})` : d.productId));
      fact('State', h('span', { id: 'device-state' }, stateBadge(d.state)));
      fact('Online since', h('span', { id: 'device-online-time' }, d.state && d.state.value === 'online' ? when(d.onlineTime) : '–'));
      fact('Last offline', h('span', { id: 'device-offline-time' }, when(d.offlineTime)));
      fact('Created', when(d.createTime));
      if (d.transport || d.protocolName) fact('Connection', [d.transport, d.protocolName].filter(Boolean).join(' · '));
      head.replaceChildren(h('h1', { id: 'device-name' }, d.name || d.id), dl);
      $('#crumb').textContent = d.name || d.id;
      document.title = (d.name || d.id) + ' · devicehub';
    }

    function drawProperties() {
      if (props.length === 0) {
        propsBody.replaceChildren(empty('This device has no properties in its thing model.',
          'Give its product a thing model (PATCH /api/device-product) to see values here.'));
        return;
      }
      const tbody = h('tbody');
      for (const p of props) {
        const value = h('td', { class: 'value', 'data-property': p.id }, h('span', { class: 'muted' }, 'no value yet'));
        const time = h('td', { class: 'muted small' }, '');
        rows.set(p.id, { value, time });
        tbody.append(h('tr', {}, h('td', {}, h('div', { class: 'strong' }, p.name || p.id), h('div', { class: 'muted small mono' }, p.id)),
          h('td', { class: 'muted' }, typeText(p)), value, time));
      }
      propsBody.replaceChildren(h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Property'), h('th', {}, 'Type'), h('th', {}, 'Value'), h('th', {}, 'Updated'))), tbody));
    }

    function setValue(property, text, ts, flash) {
      const r = rows.get(property);
      if (!r) return;
      if (ts && r.ts && ts < r.ts) return; // an older value than the one shown
      r.ts = ts;
      r.value.textContent = text;
      r.time.textContent = when(ts);
      if (flash) {
        r.value.classList.remove('flash');
        void r.value.offsetWidth; // restart the animation
        r.value.classList.add('flash');
      }
    }

    // loadLatest shows the stored latest value of each property (endpoint 14).
    async function loadLatest() {
      const ids = props.map((p) => p.id).slice(0, 100);
      if (ids.length === 0) {
        propsBody.dataset.latest = 'loaded';
        return;
      }
      try {
        const res = await multi([{ dashboard: 'device', object: device.productId, measurement: 'properties', dimension: 'history', group: 'latest', params: { deviceId: device.id, history: 1, properties: ids } }]);
        if (closed) return;
        for (const item of res) {
          const v = item.data && item.data.value;
          if (v) setValue(v.property, v.formatValue || formatValue(props.find((p) => p.id === v.property), v.value), v.timestamp || item.data.timestamp, false);
        }
      } catch (e) {
        if (!closed) notes.replaceChildren(errorBox(e, 'Could not load the latest values'));
      } finally {
        propsBody.dataset.latest = 'loaded';
      }
    }

    // connect subscribes to the device's values and state changes.
    function connect() {
      const token = sessionStorage.getItem(TOKEN) || '';
      const q = new URLSearchParams({ deviceId: device.id, token });
      es = new EventSource('/api/live?' + q.toString());
      es.onopen = () => {
        live.textContent = 'Live updates: on';
        live.className = 'live on';
      };
      es.onerror = () => {
        if (closed) return;
        const gone = es.readyState === EventSource.CLOSED;
        live.textContent = gone ? 'Live updates: unavailable (reload the page to retry)' : 'Live updates: reconnecting…';
        live.className = 'live off';
      };
      es.addEventListener('property', (ev) => {
        const m = parse(ev.data);
        if (!m || m.deviceId !== device.id) return;
        const prop = props.find((p) => p.id === m.property);
        setValue(m.property, formatValue(prop, m.value), m.timestamp, true);
        chart.live(m);
      });
      es.addEventListener('state', (ev) => {
        const m = parse(ev.data);
        if (!m || m.deviceId !== device.id) return;
        $('#device-state').replaceChildren(stateBadge(m.state));
        if (m.state === 'online') $('#device-online-time').textContent = when(m.timestamp);
        else {
          $('#device-online-time').textContent = '–';
          $('#device-offline-time').textContent = when(m.timestamp);
          chart.offline(m.timestamp);
        }
      });
      es.addEventListener('skipped', (ev) => {
        const m = parse(ev.data);
        if (m) notes.textContent = `${count(m.count)} live updates were skipped because this page could not keep up; the values shown are the latest received.`;
      });
    }

    function parse(data) {
      try {
        return JSON.parse(data);
      } catch (e) {
        return null;
      }
    }

    return {
      leave: () => {
        closed = true;
        if (es) es.close();
        chart.leave();
      },
    };
  }

  // shadowCard is the device page's desired state: each desired property
  // against its reported value, those of the delta marked, and a form to
  // set a desired value (PUT .../shadow, conditional on the version shown)
  // or write a property now (PUT .../property).
  function shadowCard(card, getDevice, getProps) {
    let version = 0;
    const body = h('div', { class: 'table-wrap', id: 'shadow-table' });
    const propSel = h('select', { id: 'shadow-property', 'aria-label': 'Property' });
    const valueIn = h('input', { id: 'shadow-value', placeholder: 'value (JSON or text)', 'aria-label': 'Value' });
    const setBtn = h('button', { id: 'shadow-set', type: 'button' }, 'Set desired');
    const writeBtn = h('button', { id: 'shadow-write', type: 'button', class: 'secondary' }, 'Write now');
    const msg = h('p', { class: 'muted small', id: 'shadow-message' });
    const versionText = h('span', { class: 'muted small', id: 'shadow-version' });
    card.append(
      h('div', { class: 'card-head' }, h('h2', {}, 'Desired state'), versionText),
      h('p', { class: 'muted small' }, 'What the device should hold, against what it last reported; properties still to apply (the delta) are marked. The device gets its delta now if connected, else when it next connects.'),
      body,
      h('form', { id: 'shadow-form', onsubmit: (e) => e.preventDefault() }, propSel, valueIn, setBtn, writeBtn),
      msg,
    );
    const parseValue = (text) => {
      try {
        return JSON.parse(text);
      } catch (e) {
        return text;
      }
    };
    const writable = () => getProps().filter((p) => p.expands && Array.isArray(p.expands.type) && p.expands.type.includes('write'));
    async function load() {
      const d = getDevice();
      propSel.replaceChildren(...writable().map((p) => h('option', { value: p.id }, p.name || p.id)));
      const can = propSel.options.length > 0;
      setBtn.disabled = writeBtn.disabled = !can;
      if (!can) msg.textContent = 'No property of this thing model is writable (expands.type write).';
      try {
        const sh = await api('GET', `/api/device/instance/${encodeURIComponent(d.id)}/shadow`);
        draw(sh);
      } catch (e) {
        body.replaceChildren(errorBox(e, 'Could not load the desired state'));
      }
    }
    function draw(sh) {
      version = sh.version;
      versionText.textContent = `version ${sh.version}`;
      const ids = Object.keys(sh.desired || {}).sort();
      if (ids.length === 0) {
        body.replaceChildren(empty('Nothing desired.', 'Set a desired value below.'));
        body.dataset.version = String(sh.version);
        return;
      }
      const tbody = h('tbody');
      for (const id of ids) {
        const prop = getProps().find((p) => p.id === id);
        const rep = (sh.reported || {})[id];
        const pending = Object.prototype.hasOwnProperty.call(sh.delta || {}, id);
        tbody.append(h('tr', { 'data-property': id, class: pending ? 'delta' : '' },
          h('td', {}, h('div', { class: 'strong' }, (prop && prop.name) || id), h('div', { class: 'muted small mono' }, id)),
          h('td', { class: 'value desired' }, formatValue(prop, sh.desired[id].value)),
          h('td', { class: 'value reported' }, rep ? formatValue(prop, rep.value) : h('span', { class: 'muted' }, 'not reported')),
          h('td', {}, pending ? h('span', { class: 'badge warn' }, 'to apply') : h('span', { class: 'badge ok' }, 'applied'))));
      }
      body.replaceChildren(h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Property'), h('th', {}, 'Desired'), h('th', {}, 'Reported'), h('th', {}, ''))), tbody));
      body.dataset.version = String(sh.version);
    }
    setBtn.addEventListener('click', async () => {
      const d = getDevice();
      msg.textContent = '';
      try {
        const sh = await api('PUT', `/api/device/instance/${encodeURIComponent(d.id)}/shadow`, { desired: { [propSel.value]: parseValue(valueIn.value) }, version });
        draw(sh);
        msg.textContent = `Desired ${propSel.value} set (version ${sh.version}).`;
      } catch (e) {
        msg.replaceChildren(errorBox(e, 'Could not set the desired value'));
      }
    });
    writeBtn.addEventListener('click', async () => {
      const d = getDevice();
      msg.textContent = '';
      try {
        await api('PUT', `/api/device/instance/${encodeURIComponent(d.id)}/property`, { [propSel.value]: parseValue(valueIn.value) });
        msg.textContent = `The device took ${propSel.value}.`;
      } catch (e) {
        msg.replaceChildren(errorBox(e, 'Could not write the property'));
      }
    });
    return { load };
  }

  // deviceChart is the device page's chart of one numeric property: its
  // latest values (a line, extended live) or an aggregate per bucket (bars).
  function deviceChart(card, getDevice, getProps) {
    const propSel = h('select', { id: 'chart-property', 'aria-label': 'Property' });
    const modeSel = h('select', { id: 'chart-mode', 'aria-label': 'Period' },
      Object.entries(CHART_MODES).map(([k, m]) => h('option', { value: k }, m.text)));
    const aggSel = h('select', { id: 'chart-agg', 'aria-label': 'Aggregate' },
      Object.entries(AGGS).map(([k, t]) => h('option', { value: k }, t)));
    const area = h('div', { class: 'chart', id: 'property-chart' });
    const caption = h('p', { class: 'muted small', id: 'property-chart-caption' });
    const csvBtn = h('button', { type: 'button', class: 'secondary', id: 'chart-csv', title: 'Download what the chart shows as CSV' }, 'Download CSV');
    const range = rangeControls(() => load());
    modeSel.append(h('option', { value: 'custom' }, 'Custom range…'));
    card.append(h('div', { class: 'card-head' }, h('h2', {}, 'History'), h('div', { class: 'controls' }, propSel, modeSel, range.el, aggSel, csvBtn)), caption, area);
    let numeric = [];
    let points = null; // history mode: the line's points
    let buckets = null; // aggregate mode: the bars
    let seq = 0;
    let stopResize = () => {};

    function setup() {
      numeric = getProps().filter((p) => p.valueType && NUMERIC.has(p.valueType.type));
      if (numeric.length === 0) {
        card.querySelector('.controls').hidden = true;
        area.replaceChildren(empty('No numeric property to chart.', 'Charts show int, long, float and double properties of the thing model.'));
        return;
      }
      propSel.replaceChildren(...numeric.map((p) => h('option', { value: p.id }, p.name || p.id)));
      for (const s of [propSel, modeSel, aggSel]) s.addEventListener('change', load);
      csvBtn.addEventListener('click', downloadCSV);
      stopResize = onResize(draw);
      load();
    }

    const prop = () => numeric.find((p) => p.id === propSel.value);

    async function load() {
      const device = getDevice();
      const p = prop();
      if (!device || !p) return;
      const mode = modeSel.value;
      aggSel.hidden = mode === 'history';
      range.el.hidden = mode !== 'custom';
      if (mode === 'custom' && !range.valid()) {
        seq++;
        points = buckets = null;
        caption.textContent = '';
        area.replaceChildren(h('p', { class: 'error', id: 'range-error' }, 'Choose a start before the end.'));
        return;
      }
      const mine = ++seq;
      points = buckets = null;
      area.classList.add('loading');
      const q = chartQuery(device, p);
      try {
        const res = await multi([q]);
        if (mine !== seq) return;
        if (mode === 'history') {
          points = res.map((i) => ({ t: i.data.value.timestamp || i.data.timestamp, v: Number(i.data.value.value), title: `${i.data.timeString}: ${i.data.value.formatValue}` }));
        } else {
          buckets = res.slice().reverse();
        }
        draw();
      } catch (e) {
        if (mine !== seq) return;
        caption.textContent = '';
        area.replaceChildren(errorBox(e, 'Could not load the chart'));
      } finally {
        if (mine === seq) area.classList.remove('loading');
      }
    }

    // chartQuery is the endpoint 14 query of what the chart shows.
    function chartQuery(device, p) {
      const q = { dashboard: 'device', object: device.productId, measurement: 'properties', group: 'chart' };
      if (modeSel.value === 'history') {
        q.dimension = 'history';
        q.params = { deviceId: device.id, history: 100, properties: [p.id] };
      } else {
        q.dimension = 'agg';
        q.params = Object.assign({ deviceId: device.id, properties: [p.id], agg: aggSel.value, format: 'yyyy-MM-dd HH:mm' }, modeSel.value === 'custom' ? range.params() : CHART_MODES[modeSel.value].params);
      }
      return q;
    }

    // downloadCSV saves the chart's query as CSV (POST /api/dashboard/_export;
    // the token is a header, so the file is fetched, then offered).
    async function downloadCSV() {
      const device = getDevice();
      const p = prop();
      if (!device || !p) return;
      csvBtn.disabled = true;
      try {
        const res = await fetch('/api/dashboard/_export?format=csv&formatValue=true', {
          method: 'POST',
          headers: { 'Content-Type': 'application/json', Accept: 'text/csv', 'X-Access-Token': sessionStorage.getItem(TOKEN) || '' },
          body: JSON.stringify(chartQuery(device, p)),
        });
        if (!res.ok) {
          const env = await res.json().catch(() => null);
          throw new ApiError(res.status, env && env.code, (env && env.message) || `HTTP ${res.status}`);
        }
        const blob = await res.blob();
        const m = /filename="?([^";]+)"?/.exec(res.headers.get('Content-Disposition') || '');
        const a = h('a', { href: URL.createObjectURL(blob), download: m ? m[1] : 'chart.csv' });
        document.body.append(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(a.href), 10000);
      } catch (e) {
        caption.textContent = 'Could not download the CSV: ' + describe(e);
      } finally {
        csvBtn.disabled = false;
      }
    }

    function draw() {
      const p = prop();
      if (!p) return;
      const name = p.name || p.id;
      if (points) {
        if (points.length === 0) {
          caption.textContent = '';
          area.replaceChildren(empty(`No values of ${name} stored yet.`, 'Values appear here as the device reports them.'));
          return;
        }
        const last = points[points.length - 1];
        caption.textContent = `${name}: the latest ${points.length} values, from ${when(points[0].t)} to ${when(last.t)} (${zoneName()}); new values are added live; a silence breaks the line.`;
        const span = last.t - points[0].t;
        const timeText = (t) => (span > 86400000 ? zoneText(t).slice(0, 10) : zoneText(t).slice(11));
        const d = getDevice();
        const breaks = offlines.concat(d && d.offlineTime ? [d.offlineTime] : []);
        area.replaceChildren(Chart.line(points, { width: area.clientWidth, label: name, timeText, gap: gapOf(points), breaks }));
      } else if (buckets) {
        const mode = modeSel.value === 'custom' ? range.mode() : CHART_MODES[modeSel.value];
        const agg = AGGS[aggSel.value];
        const withData = buckets.filter((b) => b.data.value !== null && b.data.value !== undefined);
        caption.textContent = `${agg} of ${name}, ${mode.text.toLowerCase()}; ${withData.length} of ${buckets.length} periods have values. Times in ${zoneName()}.`;
        area.replaceChildren(Chart.bars(buckets.map((b) => ({
          label: mode.label(b.data.timeString),
          value: b.data.value === null || b.data.value === undefined ? null : Number(b.data.value),
          title: `${b.data.timeString}: ${b.data.value === null || b.data.value === undefined ? 'no values' : formatValue(p, +Number(b.data.value).toPrecision(6))}`,
        })), { width: area.clientWidth, integer: aggSel.value === 'count', label: `${agg} of ${name}` }));
      }
    }

    // live adds a value that arrived over SSE to the line of latest values.
    function live(m) {
      const p = prop();
      if (!points || !p || m.property !== p.id) return;
      const v = Number(m.value);
      if (!isFinite(v)) return;
      points.push({ t: m.timestamp, v, title: `${when(m.timestamp)}: ${formatValue(p, m.value)}` });
      if (points.length > 100) points.shift();
      draw();
    }

    // offline notes a time the device left: the line breaks there.
    const offlines = [];
    function offline(t) {
      offlines.push(t);
    }

    return { setup, live, offline, leave: () => { seq++; stopResize(); } };
  }

  // ---- the platform's time zone -------------------------------------------

  // Every time the console shows is in the platform's zone (GET
  // /api/settings: DEVICEHUB_TIMEZONE), the zone endpoint 14's buckets and
  // timeStrings follow, written as they write them (yyyy-MM-dd HH:mm:ss),
  // so a value's "Updated" time and its chart bucket read on one clock.
  // Until the settings are loaded (or if they cannot be), the browser's.
  let zone = null; // {timeZone, timeZoneAbbreviation, utcOffsetSeconds}
  let zoneFmt = null; // Intl.DateTimeFormat in zone.timeZone, or null: a fixed offset

  function setZone(z) {
    zone = z && z.timeZone ? z : null;
    zoneFmt = null;
    if (zone && zone.timeZone !== 'Local') {
      try {
        zoneFmt = new Intl.DateTimeFormat('en-CA', {
          timeZone: zone.timeZone, hourCycle: 'h23', year: 'numeric', month: '2-digit', day: '2-digit',
          hour: '2-digit', minute: '2-digit', second: '2-digit',
        });
      } catch (e) {
        zoneFmt = null; // a zone this browser does not know: the offset
      }
    }
    const label = $('#zone');
    if (label) {
      label.textContent = zone ? 'Times: ' + zoneName() : '';
      label.title = zone ? `Every time shown is in the platform's time zone, ${zone.timeZone} (${offsetText(zone.utcOffsetSeconds)} now), as endpoint 14's buckets are.` : '';
    }
  }

  const pad2 = (n) => String(n).padStart(2, '0');

  function offsetText(seconds) {
    const s = Math.abs(seconds || 0);
    return 'UTC' + (seconds < 0 ? '−' : '+') + pad2(Math.floor(s / 3600)) + ':' + pad2(Math.floor((s % 3600) / 60));
  }

  // zoneName labels the zone: "Asia/Kolkata (IST)", or the offset for the
  // server's own zone ("Local").
  function zoneName() {
    if (!zone) return Intl.DateTimeFormat().resolvedOptions().timeZone + ' (this browser)';
    const abbr = zone.timeZoneAbbreviation || offsetText(zone.utcOffsetSeconds);
    return zone.timeZone === 'Local' ? `the server's zone (${abbr}, ${offsetText(zone.utcOffsetSeconds)})` : `${zone.timeZone} (${abbr})`;
  }

  // wall is the platform zone's calendar fields of epoch ms t.
  function wall(t) {
    const d = new Date(t);
    if (zoneFmt) {
      const f = {};
      for (const p of zoneFmt.formatToParts(d)) f[p.type] = p.value;
      return { y: f.year, M: f.month, d: f.day, H: f.hour === '24' ? '00' : f.hour, m: f.minute, s: f.second };
    }
    const off = zone ? zone.utcOffsetSeconds * 1000 : -d.getTimezoneOffset() * 60000;
    const u = new Date(t + off);
    return { y: String(u.getUTCFullYear()), M: pad2(u.getUTCMonth() + 1), d: pad2(u.getUTCDate()), H: pad2(u.getUTCHours()), m: pad2(u.getUTCMinutes()), s: pad2(u.getUTCSeconds()) };
  }

  // zoneText writes epoch ms t in the platform zone as yyyy-MM-dd HH:mm:ss.
  function zoneText(t) {
    const w = wall(t);
    return `${w.y}-${w.M}-${w.d} ${w.H}:${w.m}:${w.s}`;
  }

  // fromWall is the epoch ms of a wall time (yyyy-MM-ddTHH:mm, as a
  // datetime-local input gives it) in the platform zone, or NaN.
  function fromWall(text) {
    const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})/.exec(text || '');
    if (!m) return NaN;
    const asUTC = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5]);
    // The zone's offset at that time: guess, then correct once (DST).
    const offsetAt = (t) => {
      const w = wall(t);
      return Date.UTC(+w.y, +w.M - 1, +w.d, +w.H, +w.m, +w.s) - Math.floor(t / 1000) * 1000;
    };
    let t = asUTC - offsetAt(asUTC);
    t = asUTC - offsetAt(t);
    return t;
  }

  // toWall is epoch ms t as a datetime-local input's value, in the zone.
  function toWall(t) {
    const w = wall(t);
    return `${w.y}-${w.M}-${w.d}T${w.H}:${w.m}`;
  }

  function loadZone() {
    return api('GET', '/api/settings').then(setZone, () => setZone(null));
  }

  // ---- charts: a custom time range ------------------------------------------

  // Buckets endpoint 14 offers, smallest first, and their length in ms
  // (a month and a year as their longest).
  const BUCKETS = [['1m', 60e3], ['5m', 300e3], ['15m', 900e3], ['1h', 3600e3], ['1d', 86400e3], ['1w', 7 * 86400e3], ['1M', 31 * 86400e3], ['1y', 366 * 86400e3]];

  // rangeControls are a chart's from/to inputs (wall times in the
  // platform zone) and its bucket: "auto" picks the smallest that gives
  // at most 200 bars. changed is called on every change.
  function rangeControls(changed) {
    const now = Date.now();
    const from = h('input', { type: 'datetime-local', id: 'chart-from', 'aria-label': 'From', value: toWall(now - 86400e3) });
    const to = h('input', { type: 'datetime-local', id: 'chart-to', 'aria-label': 'To', value: toWall(now) });
    const bucket = h('select', { id: 'chart-bucket', 'aria-label': 'Bucket' }, h('option', { value: 'auto' }, 'Auto'),
      BUCKETS.map(([b]) => h('option', { value: b }, 'Every ' + b)));
    const el = h('span', { class: 'range', id: 'chart-range', hidden: true }, h('label', {}, 'From ', from), h('label', {}, 'to ', to), bucket);
    for (const i of [from, to, bucket]) i.addEventListener('change', changed);
    function span() {
      const f = fromWall(from.value);
      const t = fromWall(to.value);
      return { f, t, ok: isFinite(f) && isFinite(t) && f < t };
    }
    function chosen() {
      const { f, t } = span();
      if (bucket.value !== 'auto') return BUCKETS.find(([b]) => b === bucket.value);
      return BUCKETS.find(([, ms]) => (t - f) / ms <= 200) || BUCKETS[BUCKETS.length - 1];
    }
    return {
      el,
      valid: () => span().ok,
      params: () => {
        const { f, t } = span();
        const [b, ms] = chosen();
        return { time: b, from: f, to: t, limit: Math.min(10000, Math.ceil((t - f) / ms) + 1) };
      },
      mode: () => {
        const { f, t } = span();
        const [b, ms] = chosen();
        const long = t - f > 86400e3;
        return {
          text: `Every ${b}, ${zoneText(f).slice(0, 16)} to ${zoneText(t).slice(0, 16)}`,
          label: ms >= 86400e3 ? (s) => s.slice(0, 10) : long ? (s) => s.slice(5) : (s) => s.slice(11),
        };
      },
    };
  }

  // gapOf is the time between two values past which the history line
  // breaks: three times the usual (median) spacing of the values, so that
  // an offline period or a silence shows as a gap, not a straight line.
  function gapOf(points) {
    const d = [];
    for (let i = 1; i < points.length; i++) d.push(points[i].t - points[i - 1].t);
    if (d.length < 2) return 0;
    d.sort((a, b) => a - b);
    return Math.max(1000, 3 * d[Math.floor(d.length / 2)]);
  }

  // ---- products: create, edit, thing model, deploy ----------------------------

  const TYPES = ['int', 'long', 'float', 'double', 'string', 'boolean', 'date', 'enum', 'array', 'object', 'file', 'password', 'geoPoint'];
  const UNIT_IDS = ['', 'percent', 'count', ...Object.keys(UNITS)];
  const ACCESS = ['read', 'write', 'report'];
  const SIMPLE = ['int', 'long', 'float', 'double', 'string', 'boolean', 'date'];

  // productButtons adds the products page's "New product" link, for who
  // may write products.
  function productButtons(view) {
    if (!can('product:write')) return;
    $('.page-head', view).append(h('a', { href: '#/product-new', id: 'product-new', class: 'button' }, 'New product'));
  }

  // productView creates (id null) or edits a product: its fields, its
  // thing model's properties as a form with the model's JSON beside it,
  // deploy and undeploy. The model's events, functions and tags, and
  // fields of a property the form does not show, are kept as they are.
  function productView(view, id) {
    const writable = can('product:write');
    const note = h('p', { id: 'product-note', role: 'status', class: 'muted' });
    const say = (text, isError) => { note.textContent = text; note.className = isError ? 'error' : 'ok-text'; };
    let product = null; // GET /api/device-product/{id}
    let model = { properties: [], events: [], functions: [], tags: [] };
    const f = {
      id: h('input', { id: 'product-id', 'aria-label': 'Id', placeholder: 'Id (generated if empty)', pattern: '[A-Za-z0-9_.:\\-]{1,64}', autocomplete: 'off' }),
      name: h('input', { id: 'product-name', 'aria-label': 'Name', required: true, placeholder: 'Name', autocomplete: 'off' }),
      classifiedId: h('input', { id: 'product-classified', 'aria-label': 'Classification', required: true, value: 'default', placeholder: 'Classification id' }),
      accessId: h('input', { id: 'product-access', 'aria-label': 'Access', required: true, value: 'mqtt', placeholder: 'Access id' }),
      deviceType: h('select', { id: 'product-device-type', 'aria-label': 'Device type' }, ['device', 'gateway', 'childrenDevice'].map((v) => h('option', { value: v }, v))),
      describe: h('input', { id: 'product-describe', 'aria-label': 'Description', placeholder: 'Description' }),
      regulator: h('input', { type: 'checkbox', id: 'product-regulator' }),
    };
    const rowsBody = h('tbody', { id: 'model-rows' });
    const json = h('pre', { class: 'json', id: 'model-json' });
    const state = h('span', { id: 'product-state' });
    const lifecycle = h('span', { class: 'controls' });
    const save = h('button', { type: 'submit', id: 'product-save' }, id ? 'Save' : 'Create product');
    const form = h('form', { id: 'product-form', onsubmit: (e) => { e.preventDefault(); submit(); } },
      h('section', { class: 'card' },
        h('div', { class: 'card-head' }, h('h2', {}, 'Product'), h('span', { class: 'controls' }, state, lifecycle)),
        h('div', { class: 'fields' },
          id ? null : h('label', {}, 'Id', f.id),
          h('label', {}, 'Name', f.name), h('label', {}, 'Classification', f.classifiedId),
          h('label', {}, 'Access', f.accessId), h('label', {}, 'Device type', f.deviceType),
          h('label', {}, 'Description', f.describe),
          h('label', { class: 'check' }, f.regulator, ' Controllers (endpoint 12 invokes)'))),
      h('section', { class: 'card' },
        h('div', { class: 'card-head' }, h('h2', {}, 'Thing model: properties'),
          writable ? h('button', { type: 'button', class: 'secondary', id: 'model-add', onclick: () => { addRow({ id: '', name: '', valueType: { type: 'int' }, expands: { type: ['read', 'report'] } }); sync(); } }, 'Add property') : null),
        h('div', { class: 'model-edit' },
          h('div', { class: 'table-wrap' }, h('table', { class: 'list model' },
            h('thead', {}, h('tr', {}, ['Id', 'Name', 'Type', 'Unit / scale / length / values', 'Access', ''].map((t) => h('th', {}, t)))), rowsBody)),
          h('div', { class: 'json-wrap' }, h('div', { class: 'muted small' }, 'The thing model (metadata) as it will be sent'), json)),
        writable ? h('div', { class: 'controls' }, save, note) : note));
    view.append(
      h('p', { class: 'crumbs' }, h('a', { href: '#/products' }, 'Products'), ' › ', h('span', { id: 'crumb' }, id || 'New product')),
      h('div', { class: 'page-head' }, h('h1', { id: 'product-title' }, id ? id : 'New product'),
        id ? h('a', { href: '#/devices?product=' + encodeURIComponent(id) }, 'Its devices') : null),
      form);
    const rows = []; // [{def, read()}]

    // addRow adds a form row for property definition def (kept, so that
    // fields the form does not show survive).
    function addRow(def) {
      const vt0 = def.valueType || {};
      const pid = h('input', { class: 'prop-id', 'aria-label': 'Property id', required: true, value: def.id || '', size: 10 });
      const name = h('input', { class: 'prop-name', 'aria-label': 'Property name', required: true, value: def.name || '', size: 12 });
      const type = h('select', { class: 'prop-type', 'aria-label': 'Type' }, TYPES.map((t) => h('option', { value: t, selected: t === vt0.type }, t)));
      const unit = h('select', { class: 'prop-unit', 'aria-label': 'Unit' }, UNIT_IDS.map((u) => h('option', { value: u, selected: u === (vt0.unit || ''), title: u }, u ? UNITS[u] || u : 'no unit')));
      const scale = h('input', { class: 'prop-scale', type: 'number', min: '0', max: '10', 'aria-label': 'Scale', placeholder: 'any', value: vt0.scale ?? '' });
      const maxLength = h('input', { class: 'prop-maxlength', type: 'number', min: '1', 'aria-label': 'Max length', placeholder: 'any', value: (vt0.expands && vt0.expands.maxLength) || '' });
      const elements = h('input', { class: 'prop-elements', 'aria-label': 'Values', placeholder: 'eco=Economy, boost=Boost',
        value: (vt0.elements || []).map((e) => `${e.value}=${e.text ?? e.value}`).join(', ') });
      const elementType = h('select', { class: 'prop-element-type', 'aria-label': 'Element type' }, SIMPLE.map((t) => h('option', { value: t, selected: vt0.elementType && vt0.elementType.type === t }, t)));
      const fileType = h('select', { class: 'prop-file-type', 'aria-label': 'File type' }, ['url', 'base64', 'Binary'].map((t) => h('option', { value: t, selected: vt0.fileType === t }, t)));
      const access = ACCESS.map((a) => h('label', { class: 'check' }, h('input', { type: 'checkbox', value: a, 'data-access': a, checked: ((def.expands && def.expands.type) || []).includes(a) }), ' ' + a));
      const mini = (text, input) => h('label', { class: 'mini' }, text, input);
      const wraps = { unit: mini('unit', unit), scale: mini('scale', scale), maxLength: mini('max length', maxLength), elements: mini('values', elements), elementType: mini('elements', elementType), fileType: mini('file', fileType) };
      const detail = h('span', { class: 'detail' }, Object.values(wraps));
      const tr = h('tr', { 'data-row': '' }, h('td', {}, pid), h('td', {}, name), h('td', {}, type), h('td', {}, detail), h('td', { class: 'access' }, access),
        h('td', {}, writable ? h('button', { type: 'button', class: 'secondary', title: 'Remove this property', onclick: () => { rows.splice(rows.indexOf(row), 1); tr.remove(); sync(); } }, '✕') : null));
      function shown() {
        const t = type.value;
        wraps.unit.hidden = !NUMERIC.has(t);
        wraps.scale.hidden = !(t === 'float' || t === 'double');
        wraps.maxLength.hidden = !(t === 'string' || t === 'password');
        wraps.elements.hidden = t !== 'enum';
        wraps.elementType.hidden = t !== 'array';
        wraps.fileType.hidden = t !== 'file';
      }
      type.addEventListener('change', shown);
      shown();
      const row = {
        read() {
          const out = JSON.parse(JSON.stringify(def));
          out.id = pid.value.trim();
          out.name = name.value.trim();
          const t = type.value;
          const vt = Object.assign({}, vt0, { type: t });
          for (const k of ['unit', 'scale', 'elements', 'elementType', 'fileType', 'properties', 'trueText', 'trueValue', 'falseText', 'falseValue']) delete vt[k];
          const vx = Object.assign({}, vt0.expands || {});
          delete vx.maxLength;
          if (NUMERIC.has(t) && unit.value) vt.unit = unit.value;
          if ((t === 'float' || t === 'double') && scale.value !== '') vt.scale = Number(scale.value);
          if ((t === 'string' || t === 'password') && maxLength.value !== '') vx.maxLength = Number(maxLength.value);
          if (t === 'enum') {
            vt.elements = elements.value.split(',').map((s) => s.trim()).filter(Boolean).map((s) => {
              const i = s.indexOf('=');
              return i < 0 ? { value: s, text: s } : { value: s.slice(0, i).trim(), text: s.slice(i + 1).trim() };
            });
          }
          if (t === 'array') vt.elementType = (vt0.elementType && vt0.elementType.type === elementType.value) ? vt0.elementType : { type: elementType.value };
          if (t === 'object') vt.properties = vt0.type === 'object' && vt0.properties ? vt0.properties : [];
          if (t === 'file') vt.fileType = fileType.value;
          if (t === 'boolean' && vt0.type === 'boolean') for (const k of ['trueText', 'trueValue', 'falseText', 'falseValue']) if (k in vt0) vt[k] = vt0[k];
          if (Object.keys(vx).length) vt.expands = vx; else delete vt.expands;
          out.valueType = vt;
          out.expands = Object.assign({}, def.expands || {}, { type: access.map((l) => l.firstChild).filter((c) => c.checked).map((c) => c.value) });
          return out;
        },
      };
      rows.push(row);
      rowsBody.append(tr);
      if (!writable) tr.querySelectorAll('input, select').forEach((i) => { i.disabled = true; });
    }

    function current() {
      return Object.assign({}, model, { properties: rows.map((r) => r.read()) });
    }
    function sync() {
      json.textContent = JSON.stringify(current(), null, 2);
    }
    form.addEventListener('input', sync);
    form.addEventListener('change', sync);

    function drawLifecycle() {
      if (!product) return;
      const deployed = product.state === 1;
      state.replaceChildren(h('span', { class: deployed ? 'badge state-online' : 'badge state-notActive', 'data-state': deployed ? 'deployed' : 'undeployed' }, deployed ? 'Deployed' : 'Not deployed'));
      lifecycle.replaceChildren();
      if (!writable) return;
      lifecycle.append(h('button', { type: 'button', class: 'secondary', id: deployed ? 'product-undeploy' : 'product-deploy',
        onclick: async () => {
          try {
            await api('POST', `/api/device-product/${encodeURIComponent(product.id)}/${deployed ? 'undeploy' : 'deploy'}`);
            say(deployed ? 'Undeployed: its devices cannot connect.' : 'Deployed: its devices may be deployed and connect.');
            await load();
          } catch (e) {
            say(describe(e), true);
          }
        } }, deployed ? 'Undeploy' : 'Deploy'));
    }

    async function load() {
      product = await api('GET', '/api/device-product/' + encodeURIComponent(id));
      try {
        model = product.metadata ? JSON.parse(product.metadata) : {};
      } catch (e) {
        model = {};
      }
      for (const k of ['properties', 'events', 'functions', 'tags']) if (!Array.isArray(model[k])) model[k] = [];
      f.name.value = product.name || '';
      f.classifiedId.value = product.classifiedId || '';
      f.accessId.value = product.accessId || '';
      f.deviceType.value = (product.deviceType && (product.deviceType.value || product.deviceType)) || 'device';
      f.describe.value = product.describe || '';
      f.regulator.checked = !!product.regulator;
      rows.length = 0;
      rowsBody.replaceChildren();
      model.properties.forEach(addRow);
      $('#product-title').textContent = product.name || product.id;
      $('#crumb').textContent = product.name || product.id;
      drawLifecycle();
      sync();
    }

    async function submit() {
      const metadata = JSON.stringify(current());
      const fields = {
        name: f.name.value.trim(), classifiedId: f.classifiedId.value.trim(), accessId: f.accessId.value.trim(),
        deviceType: f.deviceType.value, describe: f.describe.value, regulator: f.regulator.checked, metadata,
      };
      save.disabled = true;
      try {
        if (!id) {
          const body = Object.assign({ modelFrom: 'custom' }, fields);
          if (f.id.value.trim()) body.id = f.id.value.trim();
          const p = await api('POST', '/api/device/product', body);
          location.hash = '#/product/' + encodeURIComponent(p.id);
          return;
        }
        await api('PATCH', '/api/device-product', Object.assign({}, product, fields));
        await load();
        say('Saved.');
      } catch (e) {
        say(describe(e), true);
      } finally {
        save.disabled = false;
      }
    }

    if (!writable) Object.values(f).forEach((i) => { i.disabled = true; });
    if (id) {
      load().catch((e) => { form.replaceChildren(errorBox(e, `Could not load product ${id}`)); });
    } else {
      addRow({ id: 'temperature', name: 'Temperature', valueType: { type: 'float', scale: 1 }, expands: { type: ['read', 'report'] } });
      sync();
    }
    return {};
  }

  // ---- devices: create one, its key shown once ------------------------------

  // deviceListExtras adds to the devices page the note on its order and,
  // for who may write devices, a form that creates one (its key shown
  // once, to who holds device:secret).
  function deviceListExtras(view, product, reload) {
    $('.card', view).append(h('p', { class: 'muted small', id: 'device-order' },
      'Pages in the server\'s order of ids, which compares them as text (device-10 before device-2); the API has no natural sort, and a page is not re-sorted here.'));
    if (!can('device:write')) return;
    const productSel = h('select', { id: 'new-device-product', required: true, 'aria-label': 'Product' }, h('option', { value: '' }, 'Choose a product'));
    const did = h('input', { id: 'new-device-id', 'aria-label': 'Id', placeholder: 'Id (generated if empty)', autocomplete: 'off' });
    const name = h('input', { id: 'new-device-name', 'aria-label': 'Name', placeholder: 'Name', required: true, autocomplete: 'off' });
    const deploy = h('input', { type: 'checkbox', id: 'new-device-deploy', checked: true });
    const out = h('div', { id: 'new-device-result', role: 'status' });
    const form = h('form', { class: 'filters', id: 'new-device',
      onsubmit: async (e) => {
        e.preventDefault();
        out.replaceChildren();
        try {
          const body = { name: name.value.trim(), productId: productSel.value };
          if (did.value.trim()) body.id = did.value.trim();
          const d = await api('POST', '/api/device/instance', body);
          let deployed = '';
          if (deploy.checked) {
            try {
              await api('POST', `/api/device/instance/${encodeURIComponent(d.id)}/deploy`);
              deployed = ', deployed';
            } catch (err) {
              deployed = ', not deployed: ' + describe(err);
            }
          }
          out.replaceChildren(h('p', { class: 'ok-text' }, 'Device ', h('a', { href: '#/device/' + encodeURIComponent(d.id), id: 'new-device-link' }, d.id), ' created' + deployed + '.'),
            secretBox(d));
          form.reset();
          deploy.checked = true;
          reload();
        } catch (err) {
          out.replaceChildren(errorBox(err, 'Could not create the device'));
        }
      } }, productSel, did, name, h('label', { class: 'check' }, deploy, ' deploy it'), h('button', { type: 'submit', id: 'new-device-submit' }, 'Create device'));
    const card = h('section', { class: 'card', id: 'new-device-card', hidden: true }, h('div', { class: 'card-head' }, h('h2', {}, 'New device')), form, out);
    const toggle = h('button', { type: 'button', id: 'new-device-open', 'aria-expanded': 'false',
      onclick: () => {
        card.hidden = !card.hidden;
        toggle.setAttribute('aria-expanded', String(!card.hidden));
        if (!card.hidden) name.focus();
      } }, 'New device');
    $('.page-head', view).append(toggle);
    view.insertBefore(card, $('.page-head', view).nextSibling);
    api('POST', '/api/device-product/_query', { pageSize: 500, sorts: [{ name: 'name', order: 'asc' }] }).then((page) => {
      for (const p of (page.data || []).slice().sort(byName)) {
        productSel.append(h('option', { value: p.id, selected: p.id === product }, `${p.name || p.id} (${p.id})${p.state === 1 ? '' : ' – not deployed'}`));
      }
    }, (e) => out.replaceChildren(errorBox(e, 'Could not load the products')));
  }

  // secretBox shows a device's login from a create or rotate answer: its
  // key in clear only there, once.
  function secretBox(d) {
    const c = d.configuration || {};
    if (!c.secureKey || /^\*+$/.test(c.secureKey)) {
      return h('p', { class: 'muted small' }, 'Its key is not shown: that needs the device:secret permission.');
    }
    return h('div', { class: 'secret', id: 'device-secret' },
      h('p', { class: 'strong' }, 'Copy the key now: it is shown only this once. A lost key is replaced with "Rotate key".'),
      h('dl', { class: 'facts' }, h('dt', {}, 'Client id'), h('dd', { class: 'mono' }, d.id),
        h('dt', {}, 'User name (secureId)'), h('dd', { class: 'mono', id: 'secret-id' }, c.secureId || ''),
        h('dt', {}, 'Password (secureKey)'), h('dd', { class: 'mono', id: 'secret-key' }, c.secureKey)));
  }

  // ---- a device: lifecycle, key, property reads, function invokes --------------

  // deviceManage adds to a device page, by the user's permissions: deploy,
  // undeploy, delete, rotate the key (the head card); read a property
  // (endpoint 10); invoke a function (endpoint 12). device is endpoint 8's
  // answer, props its thing model's properties, model the whole model.
  function deviceManage(view, device, props, model, reload) {
    const id = device.id;
    const path = `/api/device/instance/${encodeURIComponent(id)}`;
    const note = h('div', { id: 'device-note', role: 'status' });
    const say = (text, isError) => note.replaceChildren(h('p', { class: isError ? 'error' : 'ok-text' }, text));
    const buttons = h('div', { class: 'controls', id: 'device-actions' });
    const act = (bid, text, fn) => h('button', { type: 'button', class: 'secondary', id: bid, onclick: async (e) => {
      e.target.disabled = true;
      try {
        await fn();
      } catch (err) {
        say(describe(err), true);
      } finally {
        e.target.disabled = false;
      }
    } }, text);
    const notActive = (device.state && device.state.value) === 'notActive';
    if (can('device:write')) {
      buttons.append(notActive
        ? act('device-deploy', 'Deploy', async () => { await api('POST', path + '/deploy'); reload('Deployed: it may connect.'); })
        : act('device-undeploy', 'Undeploy', async () => {
          if (!confirm(`Undeploy ${id}? It is disconnected and may not connect until deployed again.`)) return;
          await api('POST', path + '/undeploy');
          reload('Undeployed.');
        }));
    }
    if (can('device:secret')) {
      buttons.append(act('device-rotate', 'Rotate key', async () => {
        if (!confirm(`Give ${id} a new key? The old one stops working at once and its sessions are dropped.`)) return;
        const d = await api('POST', path + '/secret');
        note.replaceChildren(h('p', { class: 'ok-text' }, 'New key made; the old one no longer works.'), secretBox(d));
      }));
    }
    if (can('device:write')) {
      buttons.append(act('device-delete', 'Delete', async () => {
        if (!confirm(`Delete ${id}? Its login ends and it is gone from every list.`)) return;
        await api('DELETE', path);
        location.hash = '#/devices?product=' + encodeURIComponent(device.productId);
      }));
    }
    const head = $('#device-head', view);
    if (buttons.childElementCount) head.append(buttons, note);
    if (!can('device:command')) return;
    view.append(readCard(id, props), invokeCard(device, model));
  }

  // readCard reads one property from the device (endpoint 10): the value
  // it answers, or the error and its code (client_offline, time_out, the
  // device's own).
  function readCard(id, props) {
    const sel = h('select', { id: 'read-property', 'aria-label': 'Property' }, props.map((p) => h('option', { value: p.id }, p.name ? `${p.name} (${p.id})` : p.id)));
    const out = h('div', { id: 'read-result', role: 'status' });
    const button = h('button', { type: 'submit', id: 'read-submit' }, 'Read from the device');
    const form = h('form', { class: 'filters', onsubmit: async (e) => {
      e.preventDefault();
      const p = props.find((x) => x.id === sel.value);
      button.disabled = true;
      out.replaceChildren(h('p', { class: 'muted' }, 'Asking the device…'));
      const t0 = Date.now();
      try {
        const res = await api('GET', `/api/device/standard/${encodeURIComponent(id)}/property/${encodeURIComponent(sel.value)}`);
        const v = res ? res[sel.value] : undefined;
        out.replaceChildren(h('p', {}, h('span', { class: 'strong', id: 'read-value', 'data-value': JSON.stringify(v ?? null) }, v === undefined ? 'no value' : formatValue(p, v)),
          h('span', { class: 'muted small' }, ` – answered at ${zoneText(Date.now())} in ${Date.now() - t0} ms`)));
      } catch (err) {
        out.replaceChildren(h('p', { class: 'error', id: 'read-error', 'data-code': err.code || '' }, describe(err)));
      } finally {
        button.disabled = false;
      }
    } }, sel, button);
    return h('section', { class: 'card', id: 'read-card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Read a property'),
      h('span', { class: 'muted small' }, 'Asks the device now (endpoint 10); an offline or silent device answers with an error.')),
    props.length ? form : empty('No properties to read.'), out);
  }

  // DEVICE_CTRL is endpoint 12's one function as the specification fixes
  // it, for a thing model that does not declare DeviceCtrl's inputs.
  const DEVICE_CTRL = {
    id: 'DeviceCtrl', name: 'Device control', inputs: [
      { id: 'Location', name: 'Location', valueType: { type: 'string' } },
      { id: 'ProductID', name: 'Product id', valueType: { type: 'string' } },
      { id: 'OperCode', name: 'Operation', valueType: { type: 'object', properties: [
        { id: 'Switch', name: 'Switch', valueType: { type: 'enum', elements: [{ value: '0', text: 'Off' }, { value: '1', text: 'On' }] } },
        { id: 'Temperature', name: 'Temperature', valueType: { type: 'int' } },
      ] } },
    ],
  };

  // invokeCard invokes a function of a controller (endpoint 12, whose only
  // function is DeviceCtrl): a field per input of the thing model's
  // DeviceCtrl, or of the specification's if the model has none.
  function invokeCard(device, model) {
    const fns = (Array.isArray(model.functions) ? model.functions : []).filter((f) => f && f.id === 'DeviceCtrl' && Array.isArray(f.inputs));
    const fn = fns[0] || DEVICE_CTRL;
    const out = h('div', { id: 'invoke-result', role: 'status' });
    const fields = inputFields(fn.inputs, 'invoke', { ProductID: device.productId });
    const button = h('button', { type: 'submit', id: 'invoke-submit' }, 'Invoke ' + fn.id);
    const form = h('form', { class: 'invoke-form', onsubmit: async (e) => {
      e.preventDefault();
      button.disabled = true;
      try {
        const res = await api('POST', `/api/device/invoked/${encodeURIComponent(device.id)}/function/${encodeURIComponent(fn.id)}`, fields.value());
        out.replaceChildren(h('p', { class: 'ok-text', id: 'invoke-ok' }, `Sent to the device (message ${res}); it acts on it on its own time.`));
      } catch (err) {
        out.replaceChildren(h('p', { class: 'error', id: 'invoke-error', 'data-code': err.code || '' }, describe(err)));
      } finally {
        button.disabled = false;
      }
    } }, fields.el, button);
    return h('section', { class: 'card', id: 'invoke-card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Invoke a function'),
      h('span', { class: 'muted small' }, 'Endpoint 12: for controllers (a product with "Controllers" set); sent, not awaited.')), form, out);
  }

  // inputFields is a form over a function's inputs [{id, name, valueType}]
  // (objects nested): {el, value()} with value() the JSON to send.
  function inputFields(inputs, prefix, defaults) {
    const getters = [];
    const el = h('div', { class: 'fields' });
    for (const inp of inputs) {
      const vt = inp.valueType || {};
      const fid = prefix + '-' + inp.id;
      let input;
      let get;
      if (vt.type === 'object') {
        const sub = inputFields(vt.properties || [], fid, defaults);
        el.append(h('fieldset', {}, h('legend', {}, inp.name || inp.id), sub.el));
        getters.push([inp.id, sub.value]);
        continue;
      } else if (vt.type === 'enum' || vt.type === 'boolean') {
        const opts = vt.type === 'enum' ? (vt.elements || []).map((x) => [String(x.value), x.text || String(x.value)])
          : [['true', vt.trueText || 'true'], ['false', vt.falseText || 'false']];
        input = h('select', { id: fid }, opts.map(([v, t]) => h('option', { value: v }, t)));
        get = () => (vt.type === 'boolean' ? input.value === 'true' : input.value);
      } else if (NUMERIC.has(vt.type)) {
        input = h('input', { id: fid, type: 'number', step: vt.type === 'int' || vt.type === 'long' ? '1' : 'any', required: true });
        get = () => Number(input.value);
      } else {
        input = h('input', { id: fid, required: true, value: (defaults && defaults[inp.id]) || '' });
        get = () => input.value;
      }
      el.append(h('label', {}, inp.name || inp.id, input));
      getters.push([inp.id, get]);
    }
    return { el, value: () => Object.fromEntries(getters.map(([k, g]) => [k, g()])) };
  }

  route();
})();

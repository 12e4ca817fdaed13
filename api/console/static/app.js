// app.js: the devicehub console, a small single-page app over the public
// REST API and nothing else. Views (the route is the URL hash):
//   #/                 overview: counts and message volume per day / month
//   #/products         products, searched by name
//   #/devices          devices, searched by id or name, by product and state;
//                      an import of devices from a CSV or JSON file
//   #/device/<id>      a device: state, properties with live values (SSE),
//                      history and aggregate charts
//   #/users            users (administrators only): list, create, disable,
//                      enable, delete, assign roles, reset a password
//   #/audit            the audit trail of writes and logins (administrators)
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

  const when = (ms) => (ms ? new Date(ms).toLocaleString() : '–');

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
      api('GET', '/api/authorize/me').then((u) => { me = u; route(); }, (e) => {
        if (sessionStorage.getItem(TOKEN)) showLogin('Could not load your account: ' + describe(e));
      });
      return;
    }
    $('#login').hidden = true;
    $('#top').hidden = false;
    $('#nav-users').hidden = !can('user:admin');
    $('#nav-audit').hidden = !can('user:admin');
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
    } else if (path === '/account') {
      nav = 'account';
      current = accountView(view);
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
    return listView(view, params, {
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
      ],
      emptyText: (p) => p.get('q')
        ? empty(`No product name contains “${p.get('q')}”.`, 'Search looks for the text anywhere in the name.')
        : empty('No products yet.', 'Create one with POST /api/device/product (see README, Quick start), or run cmd/devicesim.'),
    });
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
      order: byId,
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
                const pw = prompt(`New password for ${u.username} (at least 8 characters). Their sessions end.`);
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

  // ---- the signed-in user's account ---------------------------------------

  // accountView shows the signed-in user's roles and permissions and a
  // form to change its own password (PUT /api/user/passwd, with the
  // current one); its other sessions end, this one stays.
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
          note.textContent = 'Password changed. Your other sessions have ended.';
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
      const quote = (v) => (/[",\n\r]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v);
      const text = 'id,secureId,secureKey\n' + devices.map((d) => [d.id, d.secureId, d.secureKey].map(quote).join(',')).join('\n') + '\n';
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
        return isFinite(n) ? new Date(n).toLocaleString() : text;
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
    card.append(h('div', { class: 'card-head' }, h('h2', {}, 'History'), h('div', { class: 'controls' }, propSel, modeSel, aggSel, csvBtn)), caption, area);
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
        q.params = Object.assign({ deviceId: device.id, properties: [p.id], agg: aggSel.value, format: 'yyyy-MM-dd HH:mm' }, CHART_MODES[modeSel.value].params);
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
        caption.textContent = `${name}: the latest ${points.length} values, from ${when(points[0].t)} to ${when(last.t)}; new values are added live.`;
        const span = last.t - points[0].t;
        const timeText = (t) => (span > 86400000 ? new Date(t).toLocaleDateString() : new Date(t).toLocaleTimeString());
        area.replaceChildren(Chart.line(points, { width: area.clientWidth, label: name, timeText }));
      } else if (buckets) {
        const mode = CHART_MODES[modeSel.value];
        const agg = AGGS[aggSel.value];
        const withData = buckets.filter((b) => b.data.value !== null && b.data.value !== undefined);
        caption.textContent = `${agg} of ${name}, ${mode.text.toLowerCase()}; ${withData.length} of ${buckets.length} periods have values.`;
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

    return { setup, live, leave: () => { seq++; stopResize(); } };
  }

  route();
})();

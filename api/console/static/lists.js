// lists.js: the searchable, paged lists: products and devices.
'use strict';

// ---- lists (products, devices) ----------------------------------------

// listView draws a searchable, paged table. opts: title, placeholder,
// filters (extra controls), query(params) -> request body, columns
// [{head, cell(item)}], emptyText(params), path, order (optional, a
// compare function: the rows of a page in the console's order, for lists
// whose server order is not the one shown; without it a page is shown in
// the server's order, which for ids and names is natural, as people read
// them: products, devices, users).
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
    const data = opts.order ? (page.data || []).slice().sort(opts.order) : page.data || [];
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

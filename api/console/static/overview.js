// overview.js: the overview page (#/).
'use strict';

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

// device.js: a device's page: properties, live values, shadow, charts.
'use strict';

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

// Values outside the thing model: endpoint 14 marks a stored property
// value that does not fit the device's thing model with outsideModel,
// {text, value} with the reason as value (undeclared, not_in_enum,
// wrong_type); the product's outsideModelPolicy says whether such
// values are kept (and marked) or dropped.
const OUTSIDE_REASONS = {
  undeclared: 'the thing model does not declare this property',
  not_in_enum: 'none of the enum\'s elements has this value',
  wrong_type: 'a value of another type than the property\'s',
};

// outsideReason is the reason a value (endpoint 14's, or a live
// message) is outside the thing model, or null.
function outsideReason(v) {
  const o = v && v.outsideModel;
  if (!o) return null;
  if (typeof o === 'string') return o;
  return o.value || o.reason || 'outside';
}

// outsideBadge marks a value outside the thing model; its tooltip gives
// the reason and what it means.
function outsideBadge(reason) {
  return h('span', { class: 'badge outside', 'data-outside': reason, title: reason + ': ' + (OUTSIDE_REASONS[reason] || 'outside the thing model') }, 'outside model');
}

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

  function drawProperties(extra) {
    if (props.length === 0 && !extra) {
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

  // extraRow adds a row for a property the thing model does not declare,
  // once its value is seen (stored under the product's keep policy).
  function extraRow(property, name, type) {
    if (rows.has(property)) return;
    const tbody = $('tbody', propsBody) || (drawProperties(true), $('tbody', propsBody));
    const value = h('td', { class: 'value', 'data-property': property });
    const time = h('td', { class: 'muted small' }, '');
    rows.set(property, { value, time, undeclared: true });
    tbody.append(h('tr', { class: 'undeclared' }, h('td', {}, h('div', { class: 'strong' }, name || property), h('div', { class: 'muted small mono' }, property)),
      h('td', { class: 'muted' }, (type || '') + ' (undeclared)'), value, time));
  }

  // setValue shows a property's value and its time; outside (a reason)
  // marks a value outside the thing model.
  function setValue(property, text, ts, flash, outside) {
    const r = rows.get(property);
    if (!r) return;
    if (ts && r.ts && ts < r.ts) return; // an older value than the one shown
    r.ts = ts;
    if (r.undeclared && !outside) outside = 'undeclared';
    r.value.replaceChildren(text, outside ? ' ' : '', outside ? outsideBadge(outside) : '');
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
      // Without properties named, endpoint 14 answers every stored
      // property, those the thing model does not declare too (up to 100
      // in the model: else they are named, the declared ones only).
      const params = { deviceId: device.id, history: 1 };
      if (props.length > 100) params.properties = ids;
      const res = await multi([{ dashboard: 'device', object: device.productId, measurement: 'properties', dimension: 'history', group: 'latest', params }]);
      if (closed) return;
      for (const item of res) {
        const v = item.data && item.data.value;
        if (!v) continue;
        const prop = props.find((p) => p.id === v.property);
        if (!prop) extraRow(v.property, v.propertyName, v.type);
        setValue(v.property, v.formatValue || formatValue(prop, v.value), v.timestamp || item.data.timestamp, false, outsideReason(v));
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
      if (!prop) extraRow(m.property, m.property, typeof m.value);
      setValue(m.property, formatValue(prop, m.value), m.timestamp, true, outsideReason(m));
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
  let early = []; // live values that came while the history query ran
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
    early = [];
    area.classList.add('loading');
    const q = chartQuery(device, p);
    try {
      const res = await multi([q]);
      if (mine !== seq) return;
      if (mode === 'history') {
        points = res.map((i) => {
          const outside = outsideReason(i.data.value);
          return { t: i.data.value.timestamp || i.data.timestamp, v: Number(i.data.value.value), outside,
            title: `${i.data.timeString}: ${i.data.value.formatValue}` + (outside ? ` (outside the thing model: ${outside})` : '') };
        });
        // Values announced live while the query ran: those it did not
        // hold yet are added.
        for (const m of early.splice(0)) addLive(m);
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
      const outside = points.filter((pt) => pt.outside);
      if (outside.length) {
        const reasons = [...new Set(outside.map((pt) => pt.outside))];
        caption.append(' ', h('span', { class: 'badge outside', id: 'chart-outside', 'data-outside': reasons.join(' '), title: reasons.map((r) => r + ': ' + (OUTSIDE_REASONS[r] || 'outside the thing model')).join('; ') },
          `${outside.length} outside the thing model`));
      }
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
  // While the history query runs (points null), live values wait in
  // early: the answer may or may not hold them.
  function live(m) {
    const p = prop();
    if (!p || m.property !== p.id) return;
    if (!points) {
      if (modeSel.value === 'history') early.push(m);
      return;
    }
    if (addLive(m)) draw();
  }

  // addLive adds a live value to the line, unless the line holds it
  // already (stored before the chart read it, announced live after).
  function addLive(m) {
    const p = prop();
    const v = Number(m.value);
    if (!isFinite(v)) return false;
    if (points.length && m.timestamp <= points[points.length - 1].t) return false;
    const outside = outsideReason(m);
    points.push({ t: m.timestamp, v, outside, title: `${when(m.timestamp)}: ${formatValue(p, m.value)}` });
    if (points.length > 100) points.shift();
    return true;
  }

  // offline notes a time the device left: the line breaks there.
  const offlines = [];
  function offline(t) {
    offlines.push(t);
  }

  return { setup, live, offline, leave: () => { seq++; stopResize(); } };
}

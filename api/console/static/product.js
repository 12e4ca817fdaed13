// product.js: a product's page: create, edit, thing model, deploy.
'use strict';

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
    // What ingest does with a value outside the thing model (an
    // undeclared property, a value not in its enum or of another type):
    // keep it, marked, or drop it. Shown once the product answers with it.
    outsidePolicy: h('select', { id: 'product-outside-policy', 'aria-label': 'Values outside the thing model' },
      h('option', { value: 'keep' }, 'keep them, marked'), h('option', { value: 'drop' }, 'drop them')),
  };
  const outsideLabel = h('label', { id: 'product-outside-label', hidden: true, title: 'outsideModelPolicy' }, 'Values outside the thing model', f.outsidePolicy);
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
        h('label', { class: 'check' }, f.regulator, ' Controllers (endpoint 12 invokes)'), outsideLabel)),
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
    outsideLabel.hidden = !('outsideModelPolicy' in product);
    const policy = product.outsideModelPolicy; // {text, value}
    f.outsidePolicy.value = (policy && (policy.value || policy)) || 'keep';
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
    if (!outsideLabel.hidden) fields.outsideModelPolicy = f.outsidePolicy.value;
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

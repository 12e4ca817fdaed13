// devicemanage.js: create a device; a device's lifecycle, key, property
// reads and function invokes.
'use strict';

// ---- devices: create one, its key shown once ------------------------------

// deviceListExtras adds to the devices page, for who may write devices,
// a form that creates one (its key shown once, to who holds device:secret).
function deviceListExtras(view, product, reload) {
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

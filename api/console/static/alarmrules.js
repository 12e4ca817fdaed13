// alarmrules.js: the Alarms page's rule editor over /api/alarm/config
// (api/alarms.go; the rule's JSON is ingest/alarm/rule.go's Rule):
//   #/alarm-rules?product=<id>   a product's rules: enable, disable, delete
//   #/alarm-rule-new?product=<id>, #/alarm-rule/<id>
//                                one rule: a form for the common cases (a
//                                trigger on properties with all/any
//                                conditions, an event, offline, no data;
//                                held for D or N times within W; how it
//                                clears; a severity ladder) beside the
//                                rule's whole JSON, both editable, each
//                                redrawn from the other; a threshold may be
//                                the device's own (ref: config.<key>,
//                                tag.<key>, property.<id>). Nested groups
//                                are the JSON's. A refusal (400) is shown beside the
//                                field it names ("trigger.all[1].value").
// Who lacks rule:write sees the rules and the editor read-only.
'use strict';

const RULE_OPS = [['gt', '>'], ['ge', '≥'], ['lt', '<'], ['le', '≤'], ['eq', '='], ['ne', '≠'], ['between', 'between'], ['changed', 'changed']];
const RULE_OFS = [['value', 'value'], ['change', 'change'], ['rate', 'rate /s']];
const TRIGGER_TYPES = [['property', 'Property conditions'], ['event', 'An event'], ['offline', 'Offline for'], ['nodata', 'No data for']];
const CLEAR_TYPES = [['trigger', 'When the trigger no longer holds'], ['condition', 'On its own condition'], ['manual', 'Only by hand']];

// ruleProductSelect is a chooser of the caller's products, in natural
// order; changed(id) on a change.
function ruleProductSelect(selected, changed) {
  const sel = h('select', { id: 'rule-product', 'aria-label': 'Product' }, h('option', { value: '' }, 'Choose a product…'));
  api('POST', '/api/device-product/_query', { pageSize: 500, sorts: [{ name: 'name', order: 'asc' }] }).then((page) => {
    for (const p of (page.data || []).slice().sort(byName)) {
      sel.append(h('option', { value: p.id, selected: p.id === selected }, (p.name || p.id) + ' (' + p.id + ')'));
    }
    sel.value = selected || '';
  }, () => {});
  sel.addEventListener('change', () => changed(sel.value));
  return sel;
}

// condText writes a condition (or a nested group) for people.
function condText(c) {
  if (!c) return '';
  if (c.all || c.any) return groupText(c);
  const op = (RULE_OPS.find(([v]) => v === c.op) || [c.op, c.op])[1];
  const of = c.of && c.of !== 'value' ? c.of + ' of ' : '';
  const value = c.op === 'changed' ? '' : ' ' + (c.ref ? c.ref : JSON.stringify(c.value));
  return of + c.property + ' ' + op + value;
}

function groupText(g) {
  if (g.any && g.any.length) return '(' + g.any.map(condText).join(' or ') + ')';
  if (g.all && g.all.length) return g.all.map(condText).join(' and ');
  return '';
}

function triggerText(r) {
  const t = r.trigger || {};
  switch (t.type) {
    case 'property': return groupText(t);
    case 'event': return 'event ' + t.event + (groupText(t) ? ' with ' + groupText(t) : '');
    case 'offline': return 'offline for ' + t.for;
    case 'nodata': return 'no data' + (t.property ? ' of ' + t.property : '') + ' for ' + t.for;
    default: return t.type || '';
  }
}

// alarmRulesView lists a product's rules (POST /api/alarm/config/_query).
function alarmRulesView(view, params) {
  const writable = can('rule:write');
  let product = params.get('product') || '';
  const note = h('p', { id: 'rules-note', role: 'status', class: 'muted small' });
  const list = h('div', { class: 'table-wrap', id: 'rules-list' });
  const newLink = h('a', { id: 'rule-new', class: 'button', href: '#/alarm-rule-new?product=' + encodeURIComponent(product), hidden: !writable || !product }, 'New rule');
  const sel = ruleProductSelect(product, (id) => {
    product = id;
    params.set('product', id);
    keepInURL('/alarm-rules', params);
    newLink.href = '#/alarm-rule-new?product=' + encodeURIComponent(id);
    newLink.hidden = !writable || !id;
    load();
  });
  view.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/alarms' }, 'Alarms'), ' / Rules'),
    h('div', { class: 'page-head' }, h('h1', {}, 'Alarm rules'), h('div', { class: 'controls' }, sel, newLink)),
    h('section', { class: 'card' }, note, list));
  let seq = 0;
  async function load() {
    const mine = ++seq;
    if (!product) {
      list.replaceChildren(empty('Choose a product to see its rules.'));
      return;
    }
    list.classList.add('loading');
    try {
      const page = await api('POST', '/api/alarm/config/_query', { paging: false, terms: [{ column: 'productId', value: product }] });
      if (mine !== seq) return;
      draw((page.data || []).slice().sort(byName));
    } catch (e) {
      if (mine === seq) list.replaceChildren(errorBox(e, 'Could not load the rules'));
    } finally {
      if (mine === seq) list.classList.remove('loading');
    }
  }
  const act = (r, action) => async () => {
    if (action === 'delete' && !window.confirm('Delete the rule ' + r.name + ' (' + r.id + ')? Its alarms stay in the records.')) return;
    try {
      const path = '/api/alarm/config/' + encodeURIComponent(r.id);
      if (action === 'delete') await api('DELETE', path);
      else await api('POST', path + '/_' + action);
      note.className = 'ok-text small';
      note.textContent = { delete: 'Deleted ', enable: 'Enabled ', disable: 'Disabled ' }[action] + r.id + '.';
      load();
    } catch (e) {
      note.className = 'error';
      note.textContent = describe(e);
    }
  };
  function draw(rules) {
    if (rules.length === 0) {
      list.replaceChildren(empty('This product has no alarm rule.', writable ? 'New rule (above) makes one.' : ''));
      return;
    }
    list.replaceChildren(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Rule', 'Severity', 'Trigger', 'State', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, rules.map((r) => h('tr', { 'data-rule': r.id },
        h('td', {}, h('a', { href: '#/alarm-rule/' + encodeURIComponent(r.id), class: 'strong rule-name', 'data-rule': r.id }, r.name),
          h('div', { class: 'muted small mono' }, r.id)),
        h('td', {}, h('span', { class: 'badge severity-' + r.severity }, r.severity),
          (r.ladder || []).length ? h('div', { class: 'muted small' }, 'up to ' + r.ladder[r.ladder.length - 1].severity) : ''),
        h('td', { class: 'mono small' }, triggerText(r)),
        h('td', {}, h('span', { class: 'badge ' + (r.enabled ? 'ok' : 'warn') + ' rule-enabled', 'data-rule': r.id }, r.enabled ? 'enabled' : 'disabled')),
        h('td', { class: 'controls' }, writable ? [
          h('button', { type: 'button', class: 'secondary', 'data-action': r.enabled ? 'disable' : 'enable', 'data-rule': r.id, onclick: act(r, r.enabled ? 'disable' : 'enable') }, r.enabled ? 'Disable' : 'Enable'),
          h('button', { type: 'button', class: 'secondary', 'data-action': 'delete', 'data-rule': r.id, onclick: act(r, 'delete') }, 'Delete'),
        ] : ''))))));
  }
  load();
  return { leave: () => { seq++; } };
}

// durationInput is a text input of a duration ("30s", "5m", or ms) at
// obj[key]; empty removes it.
function durationInput(field, obj, key, changed, disabled) {
  const v = obj[key];
  return h('input', {
    'data-field': field, class: 'duration', placeholder: 'e.g. 30s, 5m', disabled, autocomplete: 'off',
    value: v === undefined || v === null ? '' : String(v),
    oninput: (e) => {
      const t = e.target.value.trim();
      if (t === '') delete obj[key];
      else obj[key] = /^\d+$/.test(t) ? Number(t) : t;
      changed();
    },
  });
}

// ruleValue reads a threshold as the property's type wants it: numbers
// for numeric types, booleans for boolean, text otherwise; what does not
// read stays text, for the server to refuse naming the field.
function ruleValue(text, prop) {
  const t = text.trim();
  if (t === '') return undefined;
  const type = prop && prop.valueType && prop.valueType.type;
  if (NUMERIC.has(type) && t !== '' && isFinite(Number(t))) return Number(t);
  if (type === 'boolean' && (t === 'true' || t === 'false')) return t === 'true';
  return t;
}

const valueText = (v) => (v === undefined || v === null ? '' : typeof v === 'string' ? v : JSON.stringify(v));

// groupEditor edits group g (a trigger, a clear or a ladder step: {all} or
// {any}) over props (the properties, or an event's fields) at field path
// path; changed(redraw) after each edit (redraw: the form's shape changed).
function groupEditor(g, path, props, changed, disabled) {
  const comb = g.any && g.any.length ? 'any' : 'all';
  const list = g[comb] || [];
  const combSel = h('select', { 'data-field': path + '.' + comb, class: 'rule-comb', disabled, 'aria-label': 'Combine' },
    h('option', { value: 'all', selected: comb === 'all' }, 'all of'), h('option', { value: 'any', selected: comb === 'any' }, 'any of'));
  combSel.addEventListener('change', () => {
    const items = g[comb] || [];
    delete g.all;
    delete g.any;
    g[combSel.value] = items;
    changed(true);
  });
  const propOf = (id) => props.find((p) => p.id === id);
  const rows = list.map((c, i) => {
    const at = path + '.' + comb + '[' + i + ']';
    const remove = h('button', { type: 'button', class: 'secondary rule-cond-remove', disabled, title: 'Remove this condition', onclick: () => { list.splice(i, 1); if (list.length === 0) delete g[comb]; changed(true); } }, '✕');
    if (c.all || c.any) {
      return h('div', { class: 'rule-cond', 'data-field': at }, h('span', { class: 'muted mono small' }, 'nested: ' + groupText(c) + ' (edit it in the JSON)'), remove);
    }
    const propSel = h('select', { 'data-field': at + '.property', class: 'rule-cond-property', disabled, 'aria-label': 'Property' },
      h('option', { value: '' }, 'property…'),
      props.map((p) => h('option', { value: p.id, selected: p.id === c.property }, p.name && p.name !== p.id ? p.name + ' (' + p.id + ')' : p.id)),
      c.property && !propOf(c.property) ? h('option', { value: c.property, selected: true }, c.property + ' (not in the model)') : null);
    const ofSel = h('select', { 'data-field': at + '.of', class: 'rule-cond-of', disabled, 'aria-label': 'Of' },
      RULE_OFS.map(([v, t]) => h('option', { value: v, selected: (c.of || 'value') === v }, t)));
    const opSel = h('select', { 'data-field': at + '.op', class: 'rule-cond-op', disabled, 'aria-label': 'Operator' },
      h('option', { value: '' }, 'op…'), RULE_OPS.map(([v, t]) => h('option', { value: v, selected: c.op === v }, t)));
    const between = c.op === 'between';
    const pair = Array.isArray(c.value) ? c.value : [];
    const val = h('input', {
      'data-field': at + '.value', class: 'rule-cond-value', disabled, autocomplete: 'off', 'aria-label': between ? 'From' : 'Value',
      placeholder: between ? 'from' : 'value', value: valueText(between ? pair[0] : c.value), hidden: c.op === 'changed',
    });
    const val2 = h('input', { class: 'rule-cond-value2', disabled, autocomplete: 'off', 'aria-label': 'To', placeholder: 'to', value: valueText(pair[1]), hidden: !between });
    // The threshold may be the device's own (its configuration, a tag, or
    // its latest report of a property), the value its default.
    const ref = h('input', {
      'data-field': at + '.ref', class: 'rule-cond-ref', disabled, autocomplete: 'off', 'aria-label': 'The device\'s threshold',
      placeholder: 'or the device\'s: config.<key>', title: 'A threshold of each device: config.<key>, tag.<key> or property.<id>; the value is its default',
      value: c.ref || '', hidden: c.op === 'changed' || between,
      oninput: (e) => { const t = e.target.value.trim(); if (t) c.ref = t; else delete c.ref; changed(false); },
    });
    const readValue = () => {
      const p = propOf(c.property);
      if (c.op === 'changed') delete c.value;
      else if (c.op === 'between') c.value = [ruleValue(val.value, p), ruleValue(val2.value, p)];
      else {
        const v = ruleValue(val.value, p);
        if (v === undefined) delete c.value;
        else c.value = v;
      }
    };
    propSel.addEventListener('change', () => { c.property = propSel.value; readValue(); changed(false); });
    ofSel.addEventListener('change', () => { if (ofSel.value === 'value') delete c.of; else c.of = ofSel.value; changed(false); });
    opSel.addEventListener('change', () => { c.op = opSel.value; readValue(); changed(true); });
    val.addEventListener('input', () => { readValue(); changed(false); });
    val2.addEventListener('input', () => { readValue(); changed(false); });
    return h('div', { class: 'rule-cond', 'data-field': at }, ofSel, propSel, opSel, val, val2, ref, remove);
  });
  const add = h('button', {
    type: 'button', class: 'secondary rule-cond-add', disabled,
    onclick: () => { (g[comb] = g[comb] || []).push({ property: (props[0] || {}).id || '', op: 'gt' }); changed(true); },
  }, '+ Condition');
  return h('div', { class: 'rule-group', 'data-field': path }, h('div', { class: 'controls' }, combSel, h('span', { class: 'muted small' }, 'these conditions')), rows, add);
}

// alarmRuleView creates (id null; the product from the URL) or edits a
// rule.
function alarmRuleView(view, id, params) {
  const writable = can('rule:write');
  const disabled = !writable;
  let rule = id ? null : {
    id: '', name: '', productId: params.get('product') || '', severity: 'major', enabled: true,
    trigger: { type: 'property', all: [] }, clear: { type: 'trigger' },
  };
  let model = { properties: [], events: [] };
  const note = h('p', { id: 'rule-note', role: 'status', class: 'muted' });
  const form = h('div', { id: 'rule-form' });
  const json = h('textarea', { id: 'rule-json', class: 'json', rows: 24, spellcheck: 'false', disabled, 'aria-label': 'The rule as JSON', 'data-field': '' });
  const jsonNote = h('p', { id: 'rule-json-error', class: 'error', role: 'alert', hidden: true });
  const save = h('button', { type: 'button', id: 'rule-save', hidden: !writable }, id ? 'Save' : 'Create');
  const back = h('a', { href: '#/alarm-rules', id: 'rule-back' }, 'Rules');
  view.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/alarms' }, 'Alarms'), ' / ', back, ' / ', id || 'New rule'),
    h('div', { class: 'page-head' }, h('h1', {}, id ? 'Alarm rule ' + id : 'New alarm rule'), h('div', { class: 'controls' }, save)),
    note,
    h('section', { class: 'card model-edit rule-edit' },
      form,
      h('div', { class: 'json-wrap' }, h('div', { class: 'muted small' }, 'The whole rule as JSON (README, Alarms): edit either side'), json, jsonNote)));

  const showJSON = () => { json.value = JSON.stringify(rule, null, 2); };
  const changed = (redraw) => {
    showJSON();
    jsonNote.hidden = true;
    if (redraw) drawForm();
  };
  json.addEventListener('input', () => {
    let r;
    try {
      r = JSON.parse(json.value);
    } catch (e) {
      jsonNote.textContent = 'Not JSON yet: ' + e.message;
      jsonNote.hidden = false;
      return;
    }
    if (!r || typeof r !== 'object' || Array.isArray(r)) {
      jsonNote.textContent = 'A rule is a JSON object.';
      jsonNote.hidden = false;
      return;
    }
    jsonNote.hidden = true;
    rule = r;
    drawForm();
  });

  const input = (field, obj, key, attrs) => h('input', Object.assign({
    'data-field': field, disabled, autocomplete: 'off', value: obj[key] === undefined ? '' : String(obj[key]),
    oninput: (e) => { obj[key] = e.target.value; changed(false); },
  }, attrs || {}));
  const select = (field, options, value, set, attrs) => {
    const s = h('select', Object.assign({ 'data-field': field, disabled }, attrs || {}),
      options.map(([v, t]) => h('option', { value: v, selected: v === value }, t)));
    s.addEventListener('change', () => set(s.value));
    return s;
  };
  const label = (text, ...control) => h('label', {}, text, ...control);

  function drawForm() {
    const r = rule;
    r.trigger = r.trigger && typeof r.trigger === 'object' ? r.trigger : { type: 'property' };
    r.clear = r.clear && typeof r.clear === 'object' ? r.clear : {};
    const t = r.trigger;
    const props = model.properties || [];
    const events = model.events || [];
    const parts = [];
    parts.push(h('div', { class: 'fields' },
      label('Id', input('id', r, 'id', { id: 'rule-id', disabled: disabled || !!id, placeholder: 'letters, digits, - _ .' })),
      label('Name', input('name', r, 'name', { id: 'rule-name', placeholder: 'e.g. Boiler too hot' })),
      label('Severity', select('severity', SEVERITIES.map((s) => [s, s]), r.severity, (v) => { r.severity = v; changed(false); }, { id: 'rule-severity' })),
      h('label', { class: 'check' }, h('input', { type: 'checkbox', id: 'rule-enabled', 'data-field': 'enabled', disabled, checked: !!r.enabled, onchange: (e) => { r.enabled = e.target.checked; changed(false); } }), 'enabled'),
      label('Description', input('description', r, 'description', { id: 'rule-description' }))));

    // The trigger.
    const trig = h('fieldset', { class: 'rule-part', 'data-field': 'trigger' }, h('legend', {}, 'Raise when'));
    trig.append(h('div', { class: 'fields' }, label('Trigger', select('trigger.type', TRIGGER_TYPES, t.type, (v) => {
      r.trigger = { type: v };
      if (v === 'property') r.trigger.all = [];
      if (v === 'offline' || v === 'nodata') { r.trigger.for = '5m'; delete r.duration; delete r.repeat; delete r.ladder; }
      if (v === 'event') { r.trigger.event = (events[0] || {}).id || ''; delete r.duration; if (!r.clear.for && (r.clear.type || 'trigger') === 'trigger') r.clear.for = '1m'; }
      if (v !== 'property' && r.clear.type === 'condition') r.clear = { type: 'trigger' };
      changed(true);
    }, { id: 'rule-trigger-type' }))));
    if (t.type === 'property') {
      trig.append(groupEditor(t, 'trigger', props, changed, disabled));
    } else if (t.type === 'event') {
      trig.append(h('div', { class: 'fields' }, label('Event', select('trigger.event', [['', 'event…'], ...events.map((e) => [e.id, e.name && e.name !== e.id ? e.name + ' (' + e.id + ')' : e.id])], t.event,
        (v) => { t.event = v; changed(true); }, { id: 'rule-event' }))));
      const ev = events.find((e) => e.id === t.event);
      const fields = ev && ev.valueType && ev.valueType.type === 'object' ? ev.valueType.properties || [] : [];
      if (fields.length) trig.append(h('div', { class: 'muted small' }, 'Only when its fields match (optional):'), groupEditor(t, 'trigger', fields, changed, disabled));
    } else if (t.type === 'offline' || t.type === 'nodata') {
      trig.append(h('div', { class: 'fields' },
        label('For', durationInput('trigger.for', t, 'for', () => changed(false), disabled)),
        t.type === 'nodata' ? label('Of', select('trigger.property', [['', 'any report'], ...props.map((p) => [p.id, p.id])], t.property || '',
          (v) => { if (v) t.property = v; else delete t.property; changed(false); }, { id: 'rule-nodata-property' })) : null));
    }
    // Duration or repetition (property and event triggers).
    if (t.type === 'property' || t.type === 'event') {
      const mode = r.repeat ? 'repeat' : r.duration ? 'held' : 'once';
      const modes = [['once', 'at once'], ['repeat', 'met N times within W']];
      if (t.type === 'property') modes.splice(1, 0, ['held', 'held for at least D']);
      const row = h('div', { class: 'fields' }, label('How soon', select('repeat', modes, mode, (v) => {
        delete r.duration;
        delete r.repeat;
        if (v === 'held') r.duration = '1m';
        if (v === 'repeat') r.repeat = { count: 3, within: '1m' };
        changed(true);
      }, { id: 'rule-raise' })));
      if (mode === 'held') row.append(label('D', durationInput('duration', r, 'duration', () => changed(false), disabled)));
      if (mode === 'repeat') {
        row.append(label('N', h('input', { 'data-field': 'repeat.count', type: 'number', min: 1, disabled, value: r.repeat.count, class: 'count',
          oninput: (e) => { r.repeat.count = Number(e.target.value); changed(false); } })),
        label('W', durationInput('repeat.within', r.repeat, 'within', () => changed(false), disabled)));
      }
      trig.append(row);
    }
    parts.push(trig);

    // How it clears.
    const c = r.clear;
    const clr = h('fieldset', { class: 'rule-part', 'data-field': 'clear' }, h('legend', {}, 'Clear'));
    const clearTypes = t.type === 'property' ? CLEAR_TYPES : CLEAR_TYPES.filter(([v]) => v !== 'condition');
    const row = h('div', { class: 'fields' }, label('How', select('clear.type', clearTypes, c.type || 'trigger', (v) => {
      r.clear = { type: v };
      if (v === 'condition') r.clear.all = [];
      if (v === 'trigger' && t.type === 'event') r.clear.for = '1m';
      changed(true);
    }, { id: 'rule-clear-type' })));
    if ((c.type || 'trigger') === 'trigger') row.append(label(t.type === 'event' ? 'No such event for' : 'For at least (optional)', durationInput('clear.for', c, 'for', () => changed(false), disabled)));
    clr.append(row);
    if (c.type === 'condition') clr.append(groupEditor(c, 'clear', props, changed, disabled));
    parts.push(clr);

    // The severity ladder.
    if (t.type === 'property' || t.type === 'event') {
      const ev = events.find((e) => e.id === t.event);
      const stepProps = t.type === 'event' ? (ev && ev.valueType && ev.valueType.properties) || [] : props;
      const lad = h('fieldset', { class: 'rule-part', 'data-field': 'ladder', id: 'rule-ladder' }, h('legend', {}, 'Severity ladder (optional): stricter conditions, higher severities'));
      (r.ladder || []).forEach((s, i) => {
        lad.append(h('div', { class: 'rule-step', 'data-field': 'ladder[' + i + ']' },
          h('div', { class: 'fields' },
            label('Step ' + (i + 1) + ' severity', select('ladder[' + i + '].severity', SEVERITIES.map((v) => [v, v]), s.severity, (v) => { s.severity = v; changed(false); })),
            h('button', { type: 'button', class: 'secondary', disabled, onclick: () => { r.ladder.splice(i, 1); if (!r.ladder.length) delete r.ladder; changed(true); } }, 'Remove step')),
          groupEditor(s, 'ladder[' + i + ']', stepProps, changed, disabled)));
      });
      lad.append(h('button', {
        type: 'button', class: 'secondary', id: 'rule-step-add', disabled,
        onclick: () => {
          const above = SEVERITIES.filter((s) => SEVERITIES.indexOf(s) < SEVERITIES.indexOf(((r.ladder || []).slice(-1)[0] || r).severity));
          (r.ladder = r.ladder || []).push({ severity: above[above.length - 1] || 'critical', all: [] });
          changed(true);
        },
      }, '+ Step'));
      parts.push(lad);
    }
    form.replaceChildren(...parts);
  }

  save.addEventListener('click', async () => {
    let r;
    try {
      r = JSON.parse(json.value);
    } catch (e) {
      jsonNote.textContent = 'Not JSON: ' + e.message;
      jsonNote.hidden = false;
      return;
    }
    save.disabled = true;
    note.className = 'muted';
    note.textContent = 'Saving…';
    try {
      const out = id ? await api('PUT', '/api/alarm/config/' + encodeURIComponent(id), r)
        : await api('POST', '/api/alarm/config', r);
      clearFieldErrors(view);
      note.className = 'ok-text';
      note.textContent = 'Saved.';
      if (!id) location.hash = '#/alarm-rule/' + encodeURIComponent(out.id);
    } catch (e) {
      note.className = 'error';
      note.textContent = 'Not saved: the server refused the rule (below).';
      showFieldError(form, e, json);
    } finally {
      save.disabled = false;
    }
  });

  async function loadModel(product) {
    back.href = '#/alarm-rules?product=' + encodeURIComponent(product);
    if (!product) return;
    try {
      const p = await api('GET', '/api/device-product/' + encodeURIComponent(product));
      model = p.metadata ? JSON.parse(p.metadata) : {};
    } catch (e) {
      note.replaceWith(errorBox(e, 'Could not load the product\'s thing model'));
    }
  }
  (async () => {
    if (id) {
      try {
        rule = await api('GET', '/api/alarm/config/' + encodeURIComponent(id));
      } catch (e) {
        form.replaceChildren(errorBox(e, 'Could not load the rule'));
        return;
      }
      for (const k of ['creatorId', 'modifierId', 'createTime', 'modifyTime']) delete rule[k];
    }
    await loadModel(rule.productId);
    if (!rule.productId) note.textContent = 'Choose the product on the rules page first (its thing model names the properties).';
    showJSON();
    drawForm();
  })();
  return { leave: () => {} };
}

// alarms.js: the Alarms page and a device's active alarms.
'use strict';

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
  $('.page-head', view).append(h('a', { href: '#/alarm-rules', id: 'alarm-rules-link', class: 'button' }, 'Rules'));
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

// audit.js: the audit trail page (administrators).
'use strict';

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

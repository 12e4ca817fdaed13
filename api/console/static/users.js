// users.js: the Users page (administrators).
'use strict';

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

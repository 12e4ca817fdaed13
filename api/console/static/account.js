// account.js: the signed-in user's account page and its API keys.
'use strict';

// ---- the signed-in user's account ---------------------------------------

// accountView shows the signed-in user's roles and permissions and a
// form to change its own password (PUT /api/user/passwd, with the
// current one); its other sessions and its API keys end, this one stays.
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
        note.textContent = 'Password changed. Your other sessions and your API keys have ended.';
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

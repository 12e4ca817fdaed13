// import.js: the devices page's import of a CSV or JSON file.
'use strict';

// ---- device import ----------------------------------------------------

// importForm uploads a CSV (or JSON) file of devices into one product
// (POST /api/device/instance/{productId}/import, multipart), showing the
// upload's progress, then the devices created or the rows refused. The
// generated keys are shown only in that answer: the form offers them as
// a CSV download.
function importForm(preselect, done) {
  const productSel = h('select', { id: 'import-product', required: true, 'aria-label': 'Product' },
    h('option', { value: '' }, 'Choose a product'));
  const file = h('input', { type: 'file', id: 'import-file', required: true, accept: '.csv,.json,text/csv,application/json' });
  const deploy = h('input', { type: 'checkbox', id: 'import-deploy' });
  const submit = h('button', { type: 'submit', id: 'import-submit' }, 'Import');
  const progress = h('progress', { id: 'import-progress', max: '100', value: '0', hidden: true });
  const status = h('p', { id: 'import-status', class: 'muted', role: 'status' });
  const result = h('div', { id: 'import-result' });
  const form = h('form', { id: 'import-form', class: 'import-form', onsubmit: (e) => { e.preventDefault(); send(); } },
    h('label', {}, 'Product ', productSel),
    h('label', {}, 'File ', file),
    h('label', { class: 'check' }, deploy, ' Deploy them (ready to connect)'),
    submit);
  const card = h('section', { class: 'card', id: 'import-card', hidden: true },
    h('div', { class: 'card-head' }, h('h2', {}, 'Import devices'),
      h('span', { class: 'muted small' }, 'CSV with a header row: id, name (required), secureId, secureKey, description, photoUrl, orgId, storePolicy, edge, mediaDevice; up to 10,000 devices. All or nothing.')),
    form, progress, status, result);
  let xhr = null;
  let loaded = false;
  let url = '';

  async function open() {
    if (loaded) return;
    loaded = true;
    try {
      const page = await api('POST', '/api/device-product/_query', { pageSize: 500, sorts: [{ name: 'name', order: 'asc' }] });
      for (const p of (page.data || []).slice().sort(byName)) {
        productSel.append(h('option', { value: p.id, selected: p.id === preselect }, `${p.name || p.id} (${p.id})${p.state === 1 ? '' : ' – not deployed'}`));
      }
    } catch (e) {
      loaded = false;
      status.textContent = 'Could not load the products: ' + describe(e);
    }
  }

  function send() {
    if (!productSel.value || !file.files.length) return;
    const body = new FormData();
    body.append('file', file.files[0]);
    const path = `/api/device/instance/${encodeURIComponent(productSel.value)}/import` + (deploy.checked ? '?deploy=true' : '');
    const token = sessionStorage.getItem(TOKEN);
    xhr = new XMLHttpRequest();
    xhr.open('POST', path);
    if (token) xhr.setRequestHeader('X-Access-Token', token);
    xhr.setRequestHeader('Accept', 'application/json');
    submit.disabled = true;
    status.className = 'muted';
    result.replaceChildren();
    progress.hidden = false;
    progress.value = 0;
    progress.dataset.phase = 'upload';
    status.textContent = 'Uploading…';
    xhr.upload.addEventListener('progress', (e) => {
      if (e.lengthComputable) progress.value = Math.round((e.loaded / e.total) * 100);
    });
    xhr.upload.addEventListener('load', () => {
      progress.removeAttribute('value'); // indeterminate while devicehub stores them
      progress.dataset.phase = 'store';
      status.textContent = 'Uploaded; storing the devices…';
    });
    xhr.addEventListener('load', () => {
      let env = null;
      try {
        env = JSON.parse(xhr.responseText);
      } catch (e) {
        env = null;
      }
      finish(xhr.status, env);
    });
    xhr.addEventListener('error', () => finish(0, null));
    xhr.send(body);
  }

  function finish(httpStatus, env) {
    xhr = null;
    submit.disabled = false;
    progress.value = 100;
    progress.dataset.phase = 'done';
    if (httpStatus === 401 && sessionStorage.getItem(TOKEN)) {
      signOut('Your session has expired: sign in again.');
      return;
    }
    const res = env && env.result;
    if (httpStatus === 200 && res) {
      status.textContent = `Imported ${count(res.total)} devices${res.deployed ? ', deployed' : ''}.`;
      status.className = 'ok-text';
      result.replaceChildren(keysLink(res.devices || []));
      file.value = '';
      done();
      return;
    }
    status.className = 'error';
    status.textContent = env ? `${env.message} (${env.code || 'HTTP ' + httpStatus})` : 'devicehub did not answer';
    if (Array.isArray(res) && res.length) {
      result.replaceChildren(h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'import-errors' },
        h('thead', {}, h('tr', {}, ['Row', 'Id', 'Field', 'Problem'].map((t) => h('th', {}, t)))),
        h('tbody', {}, res.map((r) => h('tr', { 'data-row': r.row },
          h('td', {}, String(r.row)), h('td', { class: 'mono' }, r.id), h('td', { class: 'mono' }, r.field), h('td', {}, r.reason)))))));
    } else if (res && res.devices) { // stored, but the broker was late: the keys still come
      result.replaceChildren(keysLink(res.devices));
    }
  }

  // keysLink offers the created devices' logins as a CSV file: the keys
  // are not shown again.
  function keysLink(devices) {
    if (url) URL.revokeObjectURL(url);
    const text = 'id,secureId,secureKey\r\n' + devices.map((d) => [d.id, d.secureId, d.secureKey].map(csvCell).join(',')).join('\r\n') + '\r\n';
    url = URL.createObjectURL(new Blob([text], { type: 'text/csv' }));
    return h('p', {}, h('a', { href: url, download: 'device-logins.csv', id: 'import-keys' }, 'Download the devices\' logins (CSV)'),
      h('span', { class: 'muted small' }, ' – their keys are shown only now.'));
  }

  return {
    card, open,
    leave: () => {
      if (xhr) xhr.abort();
      if (url) URL.revokeObjectURL(url);
    },
  };
}

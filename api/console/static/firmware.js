// firmware.js: the Firmware pages over /api/firmware (api/firmware.go,
// ingest/firmware; read with device:read, written with firmware:write):
//   #/firmware?product=<id>     a product's packages (upload with its
//                               version and notes, the SHA-256 the server
//                               computed, delete) and rollouts (state,
//                               progress, counts by state); a rollout
//                               started from a package
//   #/firmware/rollout/<id>     one rollout: its settings, progress,
//                               devices by state, the failed devices with
//                               their reasons; pause, resume, cancel
// Both read again every few seconds while shown. A refusal (400) is shown
// beside the field it names.
'use strict';

const FW_STATES = ['QUEUED', 'INITIATED', 'DOWNLOADING', 'DOWNLOADED', 'VERIFIED', 'UPDATING', 'UPDATED', 'FAILED', 'TIMED_OUT', 'CANCELED'];
const FW_FAILED = new Set(['FAILED', 'TIMED_OUT']);

function rolloutBadge(state) {
  const cls = { running: 'ok', completed: 'ok', paused: 'warn', canceled: 'warn', aborted: 'warn' }[state] || '';
  return h('span', { class: 'badge rollout-state ' + cls, 'data-state': state }, state);
}

// rolloutProgress is a bar of the rollout's devices UPDATED (and failed)
// out of all.
function rolloutProgress(r) {
  const counts = r.counts || {};
  const total = r.devices || 0;
  const done = counts.UPDATED || 0;
  const failed = (counts.FAILED || 0) + (counts.TIMED_OUT || 0);
  const pct = (n) => (total ? (100 * n) / total : 0);
  return h('div', { class: 'fw-progress-wrap' },
    h('div', { class: 'fw-progress', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': total, 'aria-valuenow': done, title: `${done} of ${total} updated, ${failed} failed` },
      h('span', { class: 'fw-done', style: null }), h('span', { class: 'fw-failed' })),
    h('span', { class: 'small rollout-progress', 'data-done': done, 'data-failed': failed, 'data-total': total }, `${count(done)} of ${count(total)} updated` + (failed ? `, ${count(failed)} failed` : '')),
  );
}

// sizeBar sets the progress bar's widths (CSP: no inline style
// attributes; the style properties are set from script).
function sizeBars(root) {
  for (const bar of root.querySelectorAll('.fw-progress-wrap')) {
    const info = bar.querySelector('.rollout-progress').dataset;
    const total = Number(info.total) || 0;
    bar.querySelector('.fw-done').style.width = (total ? (100 * info.done) / total : 0) + '%';
    bar.querySelector('.fw-failed').style.width = (total ? (100 * info.failed) / total : 0) + '%';
  }
}

function countsText(counts) {
  return FW_STATES.filter((s) => counts && counts[s]).map((s) => s + ' ' + counts[s]).join(', ') || 'no device yet';
}

function firmwareView(view, params) {
  const writable = can('firmware:write');
  let product = params.get('product') || '';
  const note = notifyNote('firmware-note');
  const packages = h('div', { class: 'table-wrap', id: 'fw-packages' });
  const rollouts = h('div', { class: 'table-wrap', id: 'fw-rollouts' });
  const upload = h('div', { id: 'fw-upload' });
  const rolloutForm = h('div', { id: 'fw-rollout-editor' });
  const sel = ruleProductSelect(product, (id) => {
    product = id;
    params.set('product', id);
    keepInURL('/firmware', params);
    drawUpload();
    rolloutForm.replaceChildren();
    load();
  });
  sel.id = 'fw-product';
  view.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Firmware'), h('div', { class: 'controls' }, sel)),
    note,
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Packages')), upload, packages),
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Rollouts')), rolloutForm, rollouts));
  let pkgs = [];
  let seq = 0;
  let timer = 0;
  async function load() {
    const mine = ++seq;
    clearTimeout(timer);
    if (!product) {
      packages.replaceChildren(empty('Choose a product to see its firmware.'));
      rollouts.replaceChildren();
      return;
    }
    try {
      const q = '?productId=' + encodeURIComponent(product) + '&pageSize=100';
      const [p, r] = await Promise.all([api('GET', '/api/firmware/package' + q), api('GET', '/api/firmware/rollout' + q)]);
      if (mine !== seq) return;
      pkgs = p.data || [];
      drawPackages();
      drawRollouts(r.data || []);
      if ((r.data || []).some((x) => x.state === 'running' || x.state === 'paused')) timer = setTimeout(load, 3000);
    } catch (e) {
      if (mine === seq) packages.replaceChildren(errorBox(e, 'Could not load the firmware'));
    }
  }

  function drawUpload() {
    if (!writable || !product) {
      upload.replaceChildren();
      return;
    }
    const version = h('input', { id: 'fw-version', 'data-field': 'version', required: true, placeholder: 'e.g. 1.4.2', autocomplete: 'off' });
    const name = h('input', { id: 'fw-name', 'data-field': 'name', placeholder: 'optional', autocomplete: 'off' });
    const notes = h('textarea', { id: 'fw-notes', 'data-field': 'releaseNotes', rows: 2, placeholder: 'release notes (optional)' });
    const signature = h('input', { id: 'fw-signature', 'data-field': 'signature', placeholder: 'optional', autocomplete: 'off' });
    const file = h('input', { id: 'fw-file', 'data-field': 'file', type: 'file', required: true });
    const bar = h('progress', { id: 'fw-upload-progress', max: 1, value: 0, hidden: true });
    const send = h('button', { type: 'submit', id: 'fw-upload-submit' }, 'Upload');
    const form = h('form', { class: 'fields', id: 'fw-upload-form' },
      h('label', {}, 'Version', version), h('label', {}, 'Name', name), h('label', {}, 'File', file),
      h('label', {}, 'Signature', signature), h('label', {}, 'Release notes', notes), send, bar);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      if (!file.files[0]) return;
      const fd = new FormData();
      fd.append('productId', product);
      fd.append('version', version.value.trim());
      if (name.value.trim()) fd.append('name', name.value.trim());
      if (notes.value) fd.append('releaseNotes', notes.value);
      if (signature.value.trim()) fd.append('signature', signature.value.trim());
      fd.append('file', file.files[0]);
      // XMLHttpRequest: fetch does not report an upload's progress.
      const xhr = new XMLHttpRequest();
      xhr.open('POST', '/api/firmware/package');
      xhr.setRequestHeader('X-Access-Token', sessionStorage.getItem(TOKEN) || '');
      xhr.setRequestHeader('Accept', 'application/json');
      bar.hidden = false;
      send.disabled = true;
      xhr.upload.onprogress = (e) => { if (e.lengthComputable) bar.value = e.loaded / e.total; };
      xhr.onloadend = () => {
        send.disabled = false;
        bar.hidden = true;
        let env = null;
        try { env = JSON.parse(xhr.responseText); } catch (e) { env = null; }
        if (xhr.status === 200 && env) {
          clearFieldErrors(form);
          form.reset();
          note.say(`Uploaded ${env.result.version} (${bytesText(env.result.size)}, SHA-256 ${env.result.sha256}).`);
          load();
          return;
        }
        if (xhr.status === 401) signOut('Your session has expired: sign in again.');
        let message = (env && env.message) || `HTTP ${xhr.status}`;
        // A version the product has already: the server says so without
        // naming the field; it is the version's.
        if (env && env.code === 'duplicate_key') message = 'version: ' + message;
        showFieldError(form, new ApiError(xhr.status, env && env.code, message), send);
      };
      xhr.send(fd);
    });
    upload.replaceChildren(form);
  }

  const removePackage = (p) => async () => {
    if (!window.confirm('Delete the package ' + p.version + '?')) return;
    try {
      await api('DELETE', '/api/firmware/package/' + encodeURIComponent(p.id));
      note.say('Deleted ' + p.version + '.');
      load();
    } catch (e) {
      note.say(describe(e), true);
    }
  };
  function drawPackages() {
    if (pkgs.length === 0) {
      packages.replaceChildren(empty('No firmware package for this product yet.', writable ? 'Upload one above.' : ''));
      return;
    }
    packages.replaceChildren(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Version', 'Size', 'SHA-256', 'Uploaded', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, pkgs.map((p) => h('tr', { 'data-package': p.id },
        h('td', {}, h('span', { class: 'strong fw-version' }, p.version), p.name ? h('div', { class: 'muted small' }, p.name) : '',
          p.releaseNotes ? h('div', { class: 'small' }, p.releaseNotes) : ''),
        h('td', { class: 'small' }, bytesText(p.size)),
        h('td', { class: 'mono small wrap fw-sha', title: p.sha256 }, p.sha256),
        h('td', { class: 'small' }, when(p.createTime)),
        h('td', { class: 'controls' }, writable ? [
          h('button', { type: 'button', class: 'secondary', 'data-action': 'rollout', 'data-package': p.id, onclick: () => editRollout(p) }, 'Roll out'),
          h('button', { type: 'button', class: 'secondary', 'data-action': 'delete', 'data-package': p.id, onclick: removePackage(p) }, 'Delete'),
        ] : ''))))));
  }

  function drawRollouts(list) {
    if (list.length === 0) {
      rollouts.replaceChildren(empty('No rollout for this product yet.', writable ? 'Roll out a package (above).' : ''));
      return;
    }
    rollouts.replaceChildren(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Rollout', 'State', 'Progress', 'Devices by state', 'Started'].map((t) => h('th', {}, t)))),
      h('tbody', {}, list.map((r) => h('tr', { 'data-rollout': r.id },
        h('td', {}, h('a', { href: '#/firmware/rollout/' + encodeURIComponent(r.id), class: 'strong rollout-link', 'data-rollout': r.id }, r.version),
          h('div', { class: 'muted small mono' }, r.id)),
        h('td', {}, rolloutBadge(r.state), r.reason ? h('div', { class: 'muted small' }, r.reason) : ''),
        h('td', {}, rolloutProgress(r)),
        h('td', { class: 'small' }, countsText(r.counts)),
        h('td', { class: 'small' }, when(r.createTime)))))));
    sizeBars(rollouts);
  }

  // editRollout opens the form that rolls package p out.
  function editRollout(p) {
    clearTimeout(timer);
    const target = h('select', { id: 'fw-target', 'data-field': 'target' },
      h('option', { value: 'all' }, 'every device of the product'), h('option', { value: 'list' }, 'these devices'), h('option', { value: 'query' }, 'the devices a query selects'));
    const devices = h('input', { id: 'fw-devices', 'data-field': 'target.deviceIds', placeholder: 'device ids, comma separated', hidden: true });
    const query = h('textarea', { id: 'fw-query', 'data-field': 'target.query', rows: 3, hidden: true, spellcheck: 'false' });
    query.value = JSON.stringify({ terms: [{ column: 'state', value: 'online' }] }, null, 1);
    target.addEventListener('change', () => { devices.hidden = target.value !== 'list'; query.hidden = target.value !== 'query'; });
    const num = (id, field, value, attrs) => h('input', Object.assign({ id, 'data-field': field, type: 'number', value, class: 'count' }, attrs || {}));
    const rate = num('fw-rate', 'ratePerMinute', 60, { min: 1 });
    const timeout = num('fw-timeout', 'timeoutSeconds', 600, { min: 1 });
    const retries = num('fw-retries', 'retries', 1, { min: 0 });
    const rampInitial = num('fw-ramp-initial', 'rampUp.initialRate', '', { min: 1, placeholder: 'none' });
    const rampMinutes = num('fw-ramp-minutes', 'rampUp.minutes', '', { min: 1, placeholder: 'none' });
    const abortPct = num('fw-abort-percent', 'abort.percent', '', { min: 0, max: 99, step: 'any', placeholder: 'none' });
    const abortMin = num('fw-abort-min', 'abort.minStarted', '', { min: 1, placeholder: '10' });
    const start = h('button', { type: 'submit', id: 'fw-rollout-start' }, 'Start the rollout');
    const form = h('form', { class: 'channel-form', id: 'fw-rollout-form' },
      h('h3', {}, 'Roll out ' + p.version),
      h('div', { class: 'fields' }, h('label', {}, 'To', target), devices, query),
      h('div', { class: 'fields' }, h('label', {}, 'Devices started a minute', rate),
        h('label', {}, 'Ramp up from (a minute)', rampInitial), h('label', {}, 'over minutes', rampMinutes)),
      h('div', { class: 'fields' }, h('label', {}, 'Stop when failed % above', abortPct), h('label', {}, 'of at least started', abortMin),
        h('label', {}, 'Per device: timeout (s)', timeout), h('label', {}, 'retries', retries)),
      h('div', { class: 'controls' }, start, h('button', { type: 'button', class: 'secondary', onclick: () => { rolloutForm.replaceChildren(); load(); } }, 'Cancel')));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const spec = { packageId: p.id, target: {}, ratePerMinute: Number(rate.value), timeoutSeconds: Number(timeout.value), retries: Number(retries.value) };
      if (target.value === 'list') spec.target.deviceIds = devices.value.split(',').map((s) => s.trim()).filter(Boolean);
      if (target.value === 'query') {
        try {
          spec.target.query = JSON.parse(query.value);
        } catch (e) {
          showFieldError(form, new ApiError(400, 'illegal_argument', 'target.query: not JSON: ' + e.message), start);
          return;
        }
      }
      if (rampInitial.value || rampMinutes.value) spec.rampUp = { initialRate: Number(rampInitial.value), minutes: Number(rampMinutes.value) };
      if (abortPct.value !== '') spec.abort = { percent: Number(abortPct.value), minStarted: Number(abortMin.value || 10) };
      start.disabled = true;
      try {
        const r = await api('POST', '/api/firmware/rollout', spec);
        location.hash = '#/firmware/rollout/' + encodeURIComponent(r.id);
      } catch (e) {
        showFieldError(form, e, start);
      } finally {
        start.disabled = false;
      }
    });
    rolloutForm.replaceChildren(form);
    target.focus();
  }

  drawUpload();
  load();
  return { leave: () => { seq++; clearTimeout(timer); } };
}

// rolloutView is one rollout, read again every 2 s while it runs.
function rolloutView(view, id) {
  const writable = can('firmware:write');
  const note = notifyNote('rollout-note');
  const head = h('section', { class: 'card', id: 'rollout-head' }, h('p', { class: 'muted' }, 'Loading the rollout…'));
  const counts = h('div', { class: 'table-wrap', id: 'rollout-counts' });
  const failed = h('div', { class: 'table-wrap', id: 'rollout-failed' });
  const back = h('a', { href: '#/firmware' }, 'Firmware');
  view.append(h('p', { class: 'crumbs' }, back, ' › ', id), note, head,
    h('section', { class: 'card' }, h('h2', {}, 'Devices by state'), counts),
    h('section', { class: 'card' }, h('h2', {}, 'Failed devices'), failed));
  let seq = 0;
  let timer = 0;
  const act = (action) => async () => {
    if (action === '_cancel' && !window.confirm('Cancel the rollout? Devices not yet updated are not started.')) return;
    try {
      await api('POST', '/api/firmware/rollout/' + encodeURIComponent(id) + '/' + action);
      note.say({ _pause: 'Paused.', _resume: 'Resumed.', _cancel: 'Canceled.' }[action]);
      load();
    } catch (e) {
      note.say(describe(e), true);
    }
  };
  async function load() {
    const mine = ++seq;
    clearTimeout(timer);
    try {
      const base = '/api/firmware/rollout/' + encodeURIComponent(id);
      const [r, f] = await Promise.all([api('GET', base), api('GET', base + '/failed?pageSize=100')]);
      if (mine !== seq) return;
      back.href = '#/firmware?product=' + encodeURIComponent(r.productId);
      const dl = h('dl', { class: 'facts' });
      const fact = (k, v) => dl.append(h('dt', {}, k), h('dd', {}, v));
      fact('Product', r.productId);
      fact('Version', h('span', { class: 'mono' }, r.version));
      fact('Target', h('span', { class: 'mono small wrap' }, JSON.stringify(r.target)));
      fact('Rate', r.ratePerMinute + ' a minute' + (r.rampUp ? `, ramping up from ${r.rampUp.initialRate} over ${r.rampUp.minutes} min` : ''));
      fact('Abort', r.abort ? `above ${r.abort.percent}% failed of at least ${r.abort.minStarted} started` : 'never');
      fact('Per device', `${r.timeoutSeconds} s, ${r.retries} retries`);
      fact('Started', when(r.createTime));
      fact('Ended', r.endTime ? when(r.endTime) : '–');
      const buttons = !writable ? [] : [
        r.state === 'running' ? h('button', { type: 'button', class: 'secondary', id: 'rollout-pause', onclick: act('_pause') }, 'Pause') : null,
        r.state === 'paused' ? h('button', { type: 'button', class: 'secondary', id: 'rollout-resume', onclick: act('_resume') }, 'Resume') : null,
        r.state === 'running' || r.state === 'paused' ? h('button', { type: 'button', class: 'secondary', id: 'rollout-cancel', onclick: act('_cancel') }, 'Cancel') : null,
      ];
      head.replaceChildren(h('div', { class: 'card-head' }, h('h1', {}, 'Rollout of ' + r.version), h('span', { class: 'controls' }, rolloutBadge(r.state), buttons)),
        r.reason ? h('p', { class: 'muted', id: 'rollout-reason' }, r.reason) : '', rolloutProgress(r), dl);
      sizeBars(head);
      counts.replaceChildren(h('table', { class: 'list' }, h('tbody', {}, FW_STATES.map((s) => h('tr', { 'data-state': s, class: r.counts && r.counts[s] ? '' : 'muted' },
        h('td', {}, s), h('td', { class: 'rollout-count' }, String((r.counts && r.counts[s]) || 0)))))));
      const rows = f.data || [];
      failed.replaceChildren(rows.length === 0 ? h('p', { class: 'muted small' }, 'None.') : h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, ['Device', 'State', 'Reason', 'Attempts', 'Last report'].map((t) => h('th', {}, t)))),
        h('tbody', {}, rows.map((j) => h('tr', { 'data-device': j.deviceId },
          h('td', {}, h('a', { href: '#/device/' + encodeURIComponent(j.deviceId), class: 'strong' }, j.deviceId)),
          h('td', {}, h('span', { class: 'badge warn' }, j.state)),
          h('td', { class: 'small wrap failed-reason' }, j.reason || ''),
          h('td', {}, String(j.attempts)),
          h('td', { class: 'small' }, when(j.updateTime)))))),
        f.total > rows.length ? h('p', { class: 'muted small' }, `The first ${rows.length} of ${count(f.total)}.`) : '');
      if (r.state === 'running' || r.state === 'paused') timer = setTimeout(load, 2000);
    } catch (e) {
      if (mine === seq) head.replaceChildren(errorBox(e, 'Could not load the rollout'));
    }
  }
  load();
  return { leave: () => { seq++; clearTimeout(timer); } };
}

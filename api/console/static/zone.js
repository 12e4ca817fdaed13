// zone.js: the platform's time zone and charts' custom time ranges.
'use strict';

// ---- the platform's time zone -------------------------------------------

// Every time the console shows is in the platform's zone (GET
// /api/settings: DEVICEHUB_TIMEZONE), the zone endpoint 14's buckets and
// timeStrings follow, written as they write them (yyyy-MM-dd HH:mm:ss),
// so a value's "Updated" time and its chart bucket read on one clock.
// Until the settings are loaded (or if they cannot be), the browser's.
let zone = null; // {timeZone, timeZoneAbbreviation, utcOffsetSeconds}
let zoneFmt = null; // Intl.DateTimeFormat in zone.timeZone, or null: a fixed offset

function setZone(z) {
  zone = z && z.timeZone ? z : null;
  zoneFmt = null;
  if (zone && zone.timeZone !== 'Local') {
    try {
      zoneFmt = new Intl.DateTimeFormat('en-CA', {
        timeZone: zone.timeZone, hourCycle: 'h23', year: 'numeric', month: '2-digit', day: '2-digit',
        hour: '2-digit', minute: '2-digit', second: '2-digit',
      });
    } catch (e) {
      zoneFmt = null; // a zone this browser does not know: the offset
    }
  }
  const label = $('#zone');
  if (label) {
    label.textContent = zone ? 'Times: ' + zoneName() : '';
    label.title = zone ? `Every time shown is in the platform's time zone, ${zone.timeZone} (${offsetText(zone.utcOffsetSeconds)} now), as endpoint 14's buckets are.` : '';
  }
}

const pad2 = (n) => String(n).padStart(2, '0');

function offsetText(seconds) {
  const s = Math.abs(seconds || 0);
  return 'UTC' + (seconds < 0 ? '−' : '+') + pad2(Math.floor(s / 3600)) + ':' + pad2(Math.floor((s % 3600) / 60));
}

// zoneName labels the zone: "Asia/Kolkata (IST)", or the offset for the
// server's own zone ("Local").
function zoneName() {
  if (!zone) return Intl.DateTimeFormat().resolvedOptions().timeZone + ' (this browser)';
  const abbr = zone.timeZoneAbbreviation || offsetText(zone.utcOffsetSeconds);
  return zone.timeZone === 'Local' ? `the server's zone (${abbr}, ${offsetText(zone.utcOffsetSeconds)})` : `${zone.timeZone} (${abbr})`;
}

// wall is the platform zone's calendar fields of epoch ms t.
function wall(t) {
  const d = new Date(t);
  if (zoneFmt) {
    const f = {};
    for (const p of zoneFmt.formatToParts(d)) f[p.type] = p.value;
    return { y: f.year, M: f.month, d: f.day, H: f.hour === '24' ? '00' : f.hour, m: f.minute, s: f.second };
  }
  const off = zone ? zone.utcOffsetSeconds * 1000 : -d.getTimezoneOffset() * 60000;
  const u = new Date(t + off);
  return { y: String(u.getUTCFullYear()), M: pad2(u.getUTCMonth() + 1), d: pad2(u.getUTCDate()), H: pad2(u.getUTCHours()), m: pad2(u.getUTCMinutes()), s: pad2(u.getUTCSeconds()) };
}

// zoneText writes epoch ms t in the platform zone as yyyy-MM-dd HH:mm:ss.
function zoneText(t) {
  const w = wall(t);
  return `${w.y}-${w.M}-${w.d} ${w.H}:${w.m}:${w.s}`;
}

// fromWall is the epoch ms of a wall time (yyyy-MM-ddTHH:mm, as a
// datetime-local input gives it) in the platform zone, or NaN.
function fromWall(text) {
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})/.exec(text || '');
  if (!m) return NaN;
  const asUTC = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5]);
  // The zone's offset at that time: guess, then correct once (DST).
  const offsetAt = (t) => {
    const w = wall(t);
    return Date.UTC(+w.y, +w.M - 1, +w.d, +w.H, +w.m, +w.s) - Math.floor(t / 1000) * 1000;
  };
  let t = asUTC - offsetAt(asUTC);
  t = asUTC - offsetAt(t);
  return t;
}

// toWall is epoch ms t as a datetime-local input's value, in the zone.
function toWall(t) {
  const w = wall(t);
  return `${w.y}-${w.M}-${w.d}T${w.H}:${w.m}`;
}

function loadZone() {
  return api('GET', '/api/settings').then(setZone, () => setZone(null));
}

// ---- charts: a custom time range ------------------------------------------

// Buckets endpoint 14 offers, smallest first, and their length in ms
// (a month and a year as their longest).
const BUCKETS = [['1m', 60e3], ['5m', 300e3], ['15m', 900e3], ['1h', 3600e3], ['1d', 86400e3], ['1w', 7 * 86400e3], ['1M', 31 * 86400e3], ['1y', 366 * 86400e3]];

// rangeControls are a chart's from/to inputs (wall times in the
// platform zone) and its bucket: "auto" picks the smallest that gives
// at most 200 bars. changed is called on every change.
function rangeControls(changed) {
  const now = Date.now();
  const from = h('input', { type: 'datetime-local', id: 'chart-from', 'aria-label': 'From', value: toWall(now - 86400e3) });
  const to = h('input', { type: 'datetime-local', id: 'chart-to', 'aria-label': 'To', value: toWall(now) });
  const bucket = h('select', { id: 'chart-bucket', 'aria-label': 'Bucket' }, h('option', { value: 'auto' }, 'Auto'),
    BUCKETS.map(([b]) => h('option', { value: b }, 'Every ' + b)));
  const el = h('span', { class: 'range', id: 'chart-range', hidden: true }, h('label', {}, 'From ', from), h('label', {}, 'to ', to), bucket);
  for (const i of [from, to, bucket]) i.addEventListener('change', changed);
  function span() {
    const f = fromWall(from.value);
    const t = fromWall(to.value);
    return { f, t, ok: isFinite(f) && isFinite(t) && f < t };
  }
  function chosen() {
    const { f, t } = span();
    if (bucket.value !== 'auto') return BUCKETS.find(([b]) => b === bucket.value);
    return BUCKETS.find(([, ms]) => (t - f) / ms <= 200) || BUCKETS[BUCKETS.length - 1];
  }
  return {
    el,
    valid: () => span().ok,
    params: () => {
      const { f, t } = span();
      const [b, ms] = chosen();
      return { time: b, from: f, to: t, limit: Math.min(10000, Math.ceil((t - f) / ms) + 1) };
    },
    mode: () => {
      const { f, t } = span();
      const [b, ms] = chosen();
      const long = t - f > 86400e3;
      return {
        text: `Every ${b}, ${zoneText(f).slice(0, 16)} to ${zoneText(t).slice(0, 16)}`,
        label: ms >= 86400e3 ? (s) => s.slice(0, 10) : long ? (s) => s.slice(5) : (s) => s.slice(11),
      };
    },
  };
}

// gapOf is the time between two values past which the history line
// breaks: three times the usual (median) spacing of the values, so that
// an offline period or a silence shows as a gap, not a straight line.
function gapOf(points) {
  const d = [];
  for (let i = 1; i < points.length; i++) d.push(points[i].t - points[i - 1].t);
  if (d.length < 2) return 0;
  d.sort((a, b) => a - b);
  return Math.max(1000, 3 * d[Math.floor(d.length / 2)]);
}

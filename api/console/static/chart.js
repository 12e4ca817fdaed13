// chart.js: the console's two charts, bars and a line, drawn as SVG by
// hand (no library, no build step). Exposes window.Chart.
'use strict';
window.Chart = (() => {
  const NS = 'http://www.w3.org/2000/svg';
  const HEIGHT = 240;
  const M = { top: 14, right: 16, bottom: 34, left: 60 }; // margins around the plot

  function el(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // niceScale spans [lo, hi] with about `count` steps of 1, 2, 2.5 or 5
  // times a power of ten; whole steps only when integer.
  function niceScale(lo, hi, count, integer) {
    if (!isFinite(lo) || !isFinite(hi)) { lo = 0; hi = 1; }
    if (lo === hi) {
      const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
      lo -= lo === 0 ? 0 : pad;
      hi += pad;
    }
    const raw = (hi - lo) / count;
    const pow = Math.pow(10, Math.floor(Math.log10(raw)));
    let step = [1, 2, 2.5, 5, 10].map((m) => m * pow).find((s) => s >= raw * 0.999);
    if (integer) step = Math.max(1, Math.round(step));
    const min = Math.floor(lo / step) * step;
    const max = Math.ceil(hi / step) * step;
    const ticks = [];
    for (let i = 0; min + i * step <= max + step / 2; i++) ticks.push(+(min + i * step).toPrecision(12));
    return { min, max, ticks };
  }

  // number renders an axis or tooltip number briefly: 1.5k, 2M, 0.25.
  function number(v) {
    const a = Math.abs(v);
    const short = (x) => String(+x.toFixed(a >= 100 || a === 0 ? 0 : 2));
    if (a >= 1e9) return short(v / 1e9) + 'G';
    if (a >= 1e6) return short(v / 1e6) + 'M';
    if (a >= 1e4) return short(v / 1e3) + 'k';
    return String(+v.toPrecision(6));
  }

  // frame draws the y axis of scale s; it returns the svg and the plot box.
  function frame(width, s, label) {
    const svg = el('svg', { viewBox: `0 0 ${width} ${HEIGHT}`, class: 'chart-svg', role: 'img' });
    if (label) svg.append(el('title', {}, label));
    const box = { x: M.left, y: M.top, w: width - M.left - M.right, h: HEIGHT - M.top - M.bottom };
    const y = (v) => box.y + box.h - ((v - s.min) / (s.max - s.min)) * box.h;
    const axis = el('g', { class: 'axis' });
    for (const t of s.ticks) {
      const ty = y(t);
      axis.append(el('line', { x1: box.x, x2: box.x + box.w, y1: ty, y2: ty, class: t === 0 ? 'zero' : 'grid' }));
      axis.append(el('text', { x: box.x - 8, y: ty + 4, 'text-anchor': 'end' }, number(t)));
    }
    svg.append(axis);
    return { svg, box, y };
  }

  // xLabels writes labels under the plot, at most one per ~64 px.
  function xLabels(svg, box, marks) {
    const g = el('g', { class: 'axis' });
    for (const m of marks) g.append(el('text', { x: m.x, y: box.y + box.h + 20, 'text-anchor': m.anchor || 'middle' }, m.text));
    svg.append(g);
  }

  // bars draws one bar per item, in order, left to right. An item is
  // {label, value, title}: value a number, or null for "no data" (an
  // empty bar, drawn as a dot on the axis). Every item gets its
  // <rect class="bar">, so the bars can be counted. opts: width, label,
  // integer (whole-number axis, for counts).
  function bars(items, opts) {
    opts = opts || {};
    const width = Math.max(320, Math.round(opts.width || 720));
    const values = items.map((i) => i.value).filter((v) => v !== null && v !== undefined);
    const s = niceScale(Math.min(0, ...values), Math.max(0, ...values), 4, opts.integer);
    const { svg, box, y } = frame(width, s, opts.label);
    const band = box.w / Math.max(1, items.length);
    const bw = Math.max(1, Math.min(48, band * 0.72));
    const g = el('g', { class: 'bars' });
    const every = Math.max(1, Math.ceil(items.length / Math.max(1, Math.floor(box.w / 64))));
    const marks = [];
    items.forEach((item, i) => {
      const cx = box.x + band * (i + 0.5);
      const empty = item.value === null || item.value === undefined;
      const v = empty ? 0 : item.value;
      const top = Math.min(y(v), y(0));
      const rect = el('rect', {
        class: empty ? 'bar empty' : 'bar',
        x: (cx - bw / 2).toFixed(1), y: top.toFixed(1), width: bw.toFixed(1),
        height: Math.abs(y(v) - y(0)).toFixed(1),
        'data-label': item.label, 'data-value': empty ? '' : v,
      });
      rect.append(el('title', {}, item.title || `${item.label}: ${empty ? 'no data' : number(v)}`));
      g.append(rect);
      if (empty) g.append(el('circle', { class: 'bar-empty', cx: cx.toFixed(1), cy: y(0).toFixed(1), r: 1.5 }));
      if ((items.length - 1 - i) % every === 0) marks.push({ x: cx, text: item.label });
    });
    svg.append(g);
    xLabels(svg, box, marks);
    return svg;
  }

  // line draws points {t (epoch ms), v (number or null), title} in time
  // order; null breaks the line, and so does a silence longer than
  // opts.gap ms between two values (0: none) or a time of opts.breaks
  // (epoch ms: the device went offline) between them. timeText formats an
  // axis time.
  function line(points, opts) {
    opts = opts || {};
    const width = Math.max(320, Math.round(opts.width || 720));
    const vs = points.map((p) => p.v).filter((v) => v !== null && v !== undefined && isFinite(v));
    const s = niceScale(Math.min(...vs), Math.max(...vs), 4);
    const { svg, box, y } = frame(width, s, opts.label);
    let t0 = points.length ? points[0].t : 0;
    let t1 = points.length ? points[points.length - 1].t : 1;
    if (t1 <= t0) { t0 -= 30000; t1 += 30000; }
    const x = (t) => box.x + ((t - t0) / (t1 - t0)) * box.w;
    let d = '';
    let pen = false;
    let prev = 0;
    for (const p of points) {
      if (p.v === null || p.v === undefined || !isFinite(p.v)) { pen = false; continue; }
      if (pen && opts.gap > 0 && p.t - prev > opts.gap) pen = false; // a gap, drawn as one
      if (pen && (opts.breaks || []).some((b) => b > prev && b < p.t)) pen = false; // offline in between
      d += `${pen ? 'L' : 'M'}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`;
      pen = true;
      prev = p.t;
    }
    svg.append(el('path', { d, class: 'line' }));
    if (points.length <= 150) {
      const g = el('g', { class: 'dots' });
      for (const p of points) {
        if (p.v === null || p.v === undefined || !isFinite(p.v)) continue;
        // a value outside the thing model (p.outside: the API's reason) is marked
        const c = el('circle', { cx: x(p.t).toFixed(1), cy: y(p.v).toFixed(1), r: p.outside ? 4.5 : 3, class: p.outside ? 'dot outside' : 'dot', 'data-value': p.v });
        if (p.outside) c.setAttribute('data-outside', p.outside);
        c.append(el('title', {}, p.title || number(p.v)));
        g.append(c);
      }
      svg.append(g);
    }
    const fmt = opts.timeText || ((t) => new Date(t).toLocaleTimeString());
    const n = Math.max(2, Math.min(5, Math.floor(box.w / 140)));
    const marks = [];
    for (let i = 0; i < n; i++) {
      const t = t0 + ((t1 - t0) * i) / (n - 1);
      const text = fmt(t);
      if (marks.length && marks[marks.length - 1].text === text) continue; // a short span: say it once
      marks.push({ x: x(t), text, anchor: i === 0 ? 'start' : i === n - 1 ? 'end' : 'middle' });
    }
    xLabels(svg, box, marks);
    return svg;
  }

  return { bars, line, number };
})();

// Renders /openapi.json: the operations by tag, each with its parameters,
// request body, responses, their schemas as trees, and examples. Plain DOM,
// no library; every text from the document goes in through textContent
// (descriptions through md(), which escapes before it formats).
"use strict";

const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
let doc;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function escapeHTML(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// md renders the little Markdown the document uses: paragraphs, "- " lists,
// `code` and **bold**; the text is escaped first.
function md(text) {
  const box = el("div", "md");
  if (!text) return box;
  const inline = (s) => escapeHTML(s)
    .replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>");
  for (const block of String(text).split(/\n\n+/)) {
    const lines = block.split("\n");
    if (lines.every((l) => l.startsWith("- "))) {
      const ul = el("ul");
      for (const l of lines) {
        const li = el("li");
        li.innerHTML = inline(l.slice(2));
        ul.append(li);
      }
      box.append(ul);
    } else {
      const p = el("p");
      p.innerHTML = inline(block);
      box.append(p);
    }
  }
  return box;
}

// resolve follows a local $ref ("#/components/...") and returns
// [target, name]; name is the last segment, or "" without a $ref.
function resolve(obj) {
  if (!obj || typeof obj.$ref !== "string") return [obj, ""];
  const parts = obj.$ref.replace(/^#\//, "").split("/");
  let t = doc;
  for (const p of parts) t = t ? t[p] : undefined;
  return [t || {}, parts[parts.length - 1]];
}

// merged flattens allOf into one schema: properties, required and the
// other keywords of every part (the later wins), for display.
function merged(schema, seen) {
  const [s] = resolve(schema);
  if (!s || !s.allOf) return s || {};
  const out = Object.assign({}, s);
  delete out.allOf;
  out.properties = Object.assign({}, s.properties);
  out.required = (s.required || []).slice();
  for (const part of s.allOf) {
    const [p, name] = resolve(part);
    if (name && seen.has(name)) continue;
    const m = merged(p, seen);
    for (const [k, v] of Object.entries(m)) {
      if (k === "properties") Object.assign(out.properties, v);
      else if (k === "required") out.required.push(...v);
      else if (out[k] === undefined) out[k] = v;
    }
  }
  return out;
}

function typeLabel(schema) {
  const [s, name] = resolve(schema);
  if (!s) return "any";
  if (name && !s.allOf) return name;
  const m = merged(s, new Set());
  let t = m.type || (m.oneOf ? "one of" : m.anyOf ? "any of" : m.properties ? "object" : "any");
  if (t === "array") t = "array of " + typeLabel(m.items || {});
  if (m.format) t += " (" + m.format + ")";
  if (m.nullable) t += ", or null";
  return t;
}

// schemaTree renders a schema as nested lists of its properties, items
// and alternatives; named schemas already open on the way down are shown
// by name only (Term nests Terms).
function schemaTree(schema, seen, depth) {
  const ul = el("ul", "schema");
  const [s0, name] = resolve(schema);
  if (name) {
    if (seen.has(name) || depth > 8) {
      ul.append(el("li", "pdesc", "(" + name + ", as above)"));
      return ul;
    }
    seen = new Set(seen).add(name);
  }
  const s = merged(s0, seen);
  if (s.enum) ul.append(el("li", "pdesc", "one of: " + s.enum.map((v) => JSON.stringify(v)).join(", ")));
  const alts = s.oneOf || s.anyOf;
  if (alts) {
    alts.forEach((alt, i) => {
      const li = el("li");
      li.append(el("span", "pname", "option " + (i + 1) + ": "), el("span", "ptype", typeLabel(alt)));
      const [a] = resolve(alt);
      if (a && (a.properties || a.allOf || a.oneOf || a.items)) li.append(schemaTree(alt, seen, depth + 1));
      ul.append(li);
    });
  }
  const props = s.properties || {};
  const required = new Set(s.required || []);
  for (const [pn, ps] of Object.entries(props)) {
    const li = el("li");
    li.append(el("span", "pname", pn), document.createTextNode(" "), el("span", "ptype", typeLabel(ps)));
    if (required.has(pn)) li.append(el("span", "req", "required"));
    const [p] = resolve(ps);
    const desc = (ps && ps.description) || (p && p.description);
    if (desc) {
      const d = md(desc);
      d.className = "pdesc";
      li.append(d);
    }
    const pm = merged(p, seen);
    if (pm.enum && !pm.properties) li.append(el("span", "pdesc", "(" + pm.enum.map((v) => JSON.stringify(v)).join(", ") + ")"));
    const inner = pm.type === "array" ? pm.items : ps;
    const [ir] = resolve(inner || {});
    const im = merged(ir, seen);
    if (im && (im.properties || im.oneOf || im.anyOf || (im.additionalProperties && typeof im.additionalProperties === "object"))) {
      li.append(schemaTree(inner, seen, depth + 1));
    }
    ul.append(li);
  }
  if (s.additionalProperties && typeof s.additionalProperties === "object") {
    const li = el("li");
    li.append(el("span", "pname", "{any key}"), document.createTextNode(" "), el("span", "ptype", typeLabel(s.additionalProperties)));
    ul.append(li);
  }
  if (s.type === "array" && s.items && !Object.keys(props).length) {
    const li = el("li");
    li.append(el("span", "pname", "[ ]"), document.createTextNode(" "), el("span", "ptype", typeLabel(s.items)));
    li.append(schemaTree(s.items, seen, depth + 1));
    ul.append(li);
  }
  return ul;
}

function example(media) {
  if (!media) return null;
  let ex = media.example;
  if (ex === undefined && media.examples) {
    const first = Object.values(media.examples)[0];
    ex = first && resolve(first)[0].value;
  }
  if (ex === undefined) return null;
  return el("pre", "", typeof ex === "string" ? ex : JSON.stringify(ex, null, 2));
}

function content(box, c) {
  for (const [type, media] of Object.entries(c || {})) {
    box.append(el("div", "pdesc", type));
    if (media.schema) box.append(schemaTree(media.schema, new Set(), 0));
    const ex = example(media);
    if (ex) {
      box.append(el("h4", "", "Example"));
      box.append(ex);
    }
  }
}

function operation(path, method, op, pathParams) {
  const d = el("details", "op");
  d.id = op.operationId || method + path;
  const s = el("summary");
  s.append(el("span", "method " + method, method), el("span", "path", path), el("span", "summary", op.summary || ""));
  const sec = op.security !== undefined ? op.security : doc.security;
  s.append(el("span", "lock", sec && sec.length ? "token" : "no token"));
  d.append(s);
  const body = el("div", "opbody");
  body.append(md(op.description));
  if (sec && sec.length) {
    const names = sec.flatMap((r) => Object.keys(r)).map((n) => {
      const sch = (doc.components.securitySchemes || {})[n] || {};
      return sch.in === "query" ? "?" + sch.name + "=" : sch.name;
    });
    body.append(el("p", "pdesc", "Token: " + names.join(" or ")));
  }
  const params = pathParams.concat(op.parameters || []).map((p) => resolve(p)[0]);
  if (params.length) {
    body.append(el("h4", "", "Parameters"));
    const t = el("table");
    const head = el("tr");
    for (const h of ["name", "in", "type", "required", "description"]) head.append(el("th", "", h));
    t.append(head);
    for (const p of params) {
      const tr = el("tr");
      tr.append(el("td", "pname", p.name), el("td", "", p.in), el("td", "ptype", typeLabel(p.schema || {})),
        el("td", "", p.required ? "yes" : "no"));
      const td = el("td");
      td.append(md(p.description));
      tr.append(td);
      t.append(tr);
    }
    body.append(t);
  }
  if (op.requestBody) {
    const [rb] = resolve(op.requestBody);
    body.append(el("h4", "", "Request body" + (rb.required ? "" : " (optional)")));
    if (rb.description) body.append(md(rb.description));
    content(body, rb.content);
  }
  body.append(el("h4", "", "Responses"));
  for (const [status, r0] of Object.entries(op.responses || {})) {
    const [r] = resolve(r0);
    const box = el("div", "response");
    const head = el("div");
    head.append(el("span", "status " + (status < "400" ? "ok" : "err"), status), document.createTextNode(" "));
    box.append(head, md(r.description));
    content(box, r.content);
    // Server-Sent Events: the data schema of each event name.
    for (const [name, schema] of Object.entries(r["x-events"] || {})) {
      box.append(el("h4", "", "Event " + name));
      box.append(schemaTree(schema, new Set(), 0));
    }
    body.append(box);
  }
  d.append(body);
  return d;
}

function render() {
  document.title = doc.info.title;
  document.getElementById("title").textContent = doc.info.title + " " + doc.info.version;
  const main = document.getElementById("content");
  const toc = document.getElementById("toc");
  main.textContent = "";
  const intro = el("section", "intro");
  intro.append(md(doc.info.description));
  main.append(intro);
  const byTag = new Map((doc.tags || []).map((t) => [t.name, []]));
  for (const [path, item] of Object.entries(doc.paths)) {
    const pathParams = item.parameters || [];
    for (const m of METHODS) {
      const op = item[m];
      if (!op) continue;
      const tag = (op.tags && op.tags[0]) || "other";
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push([path, m, op, pathParams]);
    }
  }
  for (const [tag, ops] of byTag) {
    if (!ops.length) continue;
    const t = (doc.tags || []).find((x) => x.name === tag) || {};
    const section = el("section", "tag");
    section.append(el("h2", "tag", tag));
    if (t.description) {
      const d = md(t.description);
      d.className = "tagdesc";
      section.append(d);
    }
    toc.append(el("h3", "", tag));
    for (const [path, m, op, pp] of ops) {
      const d = operation(path, m, op, pp);
      d.dataset.search = (path + " " + m + " " + (op.summary || "") + " " + tag).toLowerCase();
      section.append(d);
      const a = el("a", "", m.toUpperCase() + " " + path);
      a.href = "#" + d.id;
      a.title = op.summary || "";
      a.dataset.search = d.dataset.search;
      a.addEventListener("click", () => { d.open = true; });
      toc.append(a);
    }
    main.append(section);
  }
  if (location.hash) {
    const target = document.getElementById(location.hash.slice(1));
    if (target && target.tagName === "DETAILS") {
      target.open = true;
      target.scrollIntoView();
    }
  }
}

function filter(q) {
  q = q.trim().toLowerCase();
  for (const e of document.querySelectorAll("[data-search]")) {
    e.classList.toggle("hidden", q !== "" && !e.dataset.search.includes(q));
  }
}

async function start() {
  const status = document.getElementById("status");
  try {
    const res = await fetch("/openapi.json", { headers: { Accept: "application/json" } });
    if (!res.ok) throw new Error("HTTP " + res.status);
    doc = await res.json();
  } catch (err) {
    status.textContent = "Could not load /openapi.json: " + err.message;
    return;
  }
  render();
  document.getElementById("filter").addEventListener("input", (e) => filter(e.target.value));
}

start();

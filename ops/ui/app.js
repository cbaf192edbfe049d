// weir's status page. Plain JavaScript, no library, nothing loaded from
// elsewhere. It polls v1/status (relative, so the page works under any
// prefix), draws the charts on canvases, looks identities up through
// v1/identities/{id}, and edits rules through the authenticated rules API
// (v1/rules/{id}) with the token the operator types, kept in memory only.
"use strict";

const POLL_MS = 1000;
const KEEP_POINTS = 120;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];

let history = [];            // [{t: ms, counts: {rule: {allowed, rejected, fail_open}}}]
let rulesDigest = "";        // digest of the rule set rendered in the rules table
let ruleColors = {};
let savedMsg = {};           // rule id -> "saved as version N", shown after the table is rebuilt

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "text") e.textContent = v;
    else e[k] = v;
  }
  for (const kid of kids) e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  return e;
}

function colorOf(rule) {
  if (!(rule in ruleColors)) ruleColors[rule] = COLORS[Object.keys(ruleColors).length % COLORS.length];
  return ruleColors[rule];
}

function setRows(table, rows) {
  const tb = table.querySelector("tbody");
  tb.replaceChildren(...rows);
}

async function poll() {
  try {
    const r = await fetch("v1/status", {cache: "no-store"});
    if (!r.ok) throw new Error("v1/status answered " + r.status);
    const ov = await r.json();
    document.getElementById("poll-error").hidden = true;
    render(ov);
  } catch (err) {
    const e = document.getElementById("poll-error");
    e.textContent = "cannot reach the node: " + err.message;
    e.hidden = false;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function render(ov) {
  document.getElementById("node-name").textContent = ov.node + (ov.region ? " (" + ov.region + ")" : "");
  const c = ov.canary;
  const canary = !c.enabled ? el("span", {text: "canary: off"})
    : el("span", {class: c.ok ? "ok" : "bad", id: "canary", text: "canary: " + (c.ok ? "ok" : "NOT SEEING REJECTIONS") + " (" + c.rejected + " rejected / " + (c.allowed + c.rejected + c.errors) + " probes)"});
  document.getElementById("summary").replaceChildren(
    el("span", {id: "rules-version", text: "rules v" + ov.status.rules_version}),
    el("span", {text: "digest " + ov.status.rules_digest.slice(0, 12)}),
    el("span", {class: ov.status.key_format < 2 ? "warn" : "", title: "bucket key format in force (docs/operations.md)", text: "key format " + ov.status.key_format}),
    el("span", {class: ov.rules_versions_behind > 0 ? "warn" : "", text: "behind: " + ov.rules_versions_behind}),
    ov.status.using_default_rules ? el("span", {class: "bad", text: "ENFORCING DEFAULT RULES"}) : "",
    ov.status.last_reload_error ? el("span", {class: "bad", text: "reload error: " + ov.status.last_reload_error}) : "",
    canary);
  renderMembers(ov);
  renderRates(ov);
  renderThrottled(ov);
  renderEvents(ov);
  renderLeases(ov);
  renderRules(ov);
}

function renderMembers(ov) {
  setRows(document.getElementById("members"), ov.members.map(m => el("tr", {"data-member": m.name},
    el("td", {text: m.name}),
    el("td", {text: m.region || "-"}),
    el("td", {class: m.health === "behind" ? "warn" : "ok", text: m.health}),
    el("td", {class: "version", text: String(m.rules_version)}),
    el("td", {text: m.in_ring ? (100 * m.ring_share).toFixed(1) + " %" : "other region"}))));
  const ring = document.getElementById("ring");
  const owners = ov.members.filter(m => m.in_ring);
  ring.replaceChildren(...owners.map((m, i) => {
    const d = el("div", {text: m.name, title: m.name + ": " + (100 * m.ring_share).toFixed(1) + " %"});
    d.style.width = (100 * m.ring_share) + "%";
    d.style.background = COLORS[i % COLORS.length];
    return d;
  }));
  document.getElementById("ring-note").textContent = ov.ring_sample
    ? "Ring epoch " + ov.ring_epoch + ": owners of " + ov.ring_sample + " sample identities."
    : "No cluster: this node decides every identity.";
}

function renderRates(ov) {
  const now = Date.parse(ov.at) || Date.now();
  const counts = {};
  for (const c of ov.counts) counts[c.rule] = {allowed: c.allowed, rejected: c.rejected, fail_open: c.fail_open};
  history.push({t: now, counts});
  if (history.length > KEEP_POINTS + 1) history.shift();
  const rules = Object.keys(counts).sort();
  const series = [];
  for (const rule of rules) {
    for (const kind of ["allowed", "rejected"]) series.push({rule, kind, dash: kind === "rejected", pts: rate(rule, kind)});
  }
  drawChart(document.getElementById("rates"), series, "/s");
  document.getElementById("rates-legend").replaceChildren(...rules.map(r => legend(r, "solid: accepted, dashed: rejected")));
  const fo = rules.map(rule => ({rule, kind: "fail_open", dash: false, pts: rate(rule, "fail_open")}));
  drawChart(document.getElementById("failopen"), fo, "");
  document.getElementById("failopen-legend").replaceChildren(...rules.map(r => {
    const total = counts[r].fail_open;
    return legend(r, "total " + total);
  }));
}

function legend(rule, what) {
  const i = el("i");
  i.style.background = colorOf(rule);
  return el("span", {}, i, rule + " (" + what + ")");
}

// rate returns [t, per-second] points of one counter from the history.
function rate(rule, kind) {
  const pts = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i];
    const ca = a.counts[rule], cb = b.counts[rule];
    if (!ca || !cb || b.t <= a.t) continue;
    pts.push([b.t, Math.max(0, cb[kind] - ca[kind]) * 1000 / (b.t - a.t)]);
  }
  return pts;
}

function drawChart(canvas, series, unit) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 50, B = 18;
  ctx.clearRect(0, 0, W, H);
  let tmin = Infinity, tmax = -Infinity, vmax = 1;
  for (const s of series) for (const [t, v] of s.pts) { tmin = Math.min(tmin, t); tmax = Math.max(tmax, t); vmax = Math.max(vmax, v); }
  ctx.strokeStyle = "#ccd"; ctx.fillStyle = "#556"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
  ctx.setLineDash([]);
  ctx.beginPath(); ctx.moveTo(L, 4); ctx.lineTo(L, H - B); ctx.lineTo(W - 4, H - B); ctx.stroke();
  ctx.fillText(vmax.toFixed(vmax < 10 ? 1 : 0) + unit, 2, 12);
  ctx.fillText("0", 2, H - B);
  if (!isFinite(tmin) || tmax <= tmin) { ctx.fillText("collecting…", L + 10, H / 2); return; }
  ctx.fillText(Math.round((tmax - tmin) / 1000) + " s", W - 40, H - 4);
  const x = t => L + (W - L - 6) * (t - tmin) / (tmax - tmin);
  const y = v => (H - B) - (H - B - 6) * v / vmax;
  for (const s of series) {
    if (!s.pts.length) continue;
    ctx.strokeStyle = colorOf(s.rule); ctx.lineWidth = 1.6;
    ctx.setLineDash(s.dash ? [5, 4] : []);
    ctx.beginPath();
    s.pts.forEach(([t, v], i) => i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v)));
    ctx.stroke();
  }
  ctx.setLineDash([]);
}

// aboutCount shows a decayed count of events (a top-throttled estimate) as
// the whole number it is about.
function aboutCount(c) {
  return c < 0.5 ? "< 1" : String(Math.round(c));
}

function renderThrottled(ov) {
  const rows = ov.top_throttled.map(h => el("tr", {},
    el("td", {text: h.rule}), el("td", {text: (h.identity || "(global)") + (h.source ? " (" + h.source + ")" : "")}), el("td", {text: aboutCount(h.count), title: h.count.toFixed(2) + ", a decayed estimate"}),
    el("td", {}, el("button", {text: "look up", onclick: () => lookup(h.identity, h.source)}))));
  if (!rows.length) rows.push(el("tr", {}, el("td", {colSpan: 4, class: "note", text: "nobody throttled recently"})));
  setRows(document.getElementById("throttled"), rows);
}

function renderEvents(ov) {
  const rows = ov.events.map(e => el("tr", {},
    el("td", {text: new Date(e.at).toLocaleTimeString()}), el("td", {text: e.kind}), el("td", {text: e.rule}),
    el("td", {text: e.reason}), el("td", {text: e.identity}), el("td", {text: String(e.count)})));
  if (!rows.length) rows.push(el("tr", {}, el("td", {colSpan: 6, class: "note", text: "no fail-open or fallback event"})));
  setRows(document.getElementById("events"), rows);
}

function renderLeases(ov) {
  const rows = [];
  for (const g of ov.leases) {
    if (!g.shares.length) {
      rows.push(el("tr", {"data-lease": g.rule}, el("td", {text: g.rule}), el("td", {text: g.limit + " / " + g.window}),
        el("td", {colSpan: 5, class: "note", text: g.note})));
      continue;
    }
    for (const s of g.shares) {
      rows.push(el("tr", {"data-lease": g.rule}, el("td", {text: g.rule}), el("td", {text: g.limit + " / " + g.window}),
        el("td", {text: s.region}), el("td", {text: s.rate_per_second.toFixed(2)}), el("td", {text: String(s.burst)}),
        el("td", {text: s.expires ? new Date(s.expires).toLocaleTimeString() : "-"}),
        el("td", {class: s.fallback ? "bad" : "", text: s.fallback ? "FALLBACK" : "no"})));
    }
  }
  if (!rows.length) rows.push(el("tr", {}, el("td", {colSpan: 7, class: "note", text: "no global rule in the rule set"})));
  setRows(document.getElementById("leases"), rows);
}

function renderRules(ov) {
  const note = document.getElementById("rules-note");
  note.textContent = ov.rules_api
    ? "Changes go through the rules API of the lease group and reach every node as a new version."
    : "This node serves no rules API (no lease group with admin tokens): the rules are read-only here.";
  const table = document.getElementById("rules");
  // Keep rows being edited; rebuild when the rule set changed.
  if (ov.status.rules_digest === rulesDigest) return;
  if (table.querySelector("tr[data-dirty]")) return;
  rulesDigest = ov.status.rules_digest;
  setRows(table, ov.rules.map(r => ruleRow(r, ov.rules_api)));
}

function ruleRow(r, editable) {
  const tr = el("tr", {"data-rule": r.id});
  const dirty = () => tr.setAttribute("data-dirty", "1");
  const limit = el("input", {type: "number", min: 1, value: r.limit, class: "limit", disabled: !editable, oninput: dirty});
  const burst = el("input", {type: "number", min: 1, value: r.burst, class: "burst", disabled: !editable, oninput: dirty});
  const shadow = el("input", {type: "checkbox", checked: r.shadow, class: "shadow", disabled: !editable, onchange: dirty});
  const err = field => el("span", {class: "field-error", "data-field": field});
  const status = el("div", {class: "rule-status ok", text: savedMsg[r.id] || ""});
  const save = el("button", {text: "save", class: "save", disabled: !editable,
    onclick: () => saveRule(tr, r.id, {limit: +limit.value, burst: +burst.value, shadow: shadow.checked})});
  const toggle = el("button", {text: r.shadow ? "enforce" : "shadow", class: "toggle", disabled: !editable,
    onclick: () => saveRule(tr, r.id, {shadow: !r.shadow})});
  tr.append(
    el("td", {text: r.id}), el("td", {text: r.match}), el("td", {text: r.key.join(", ") || "global"}),
    el("td", {}, limit, err("limit")), el("td", {text: r.window}), el("td", {}, burst, err("burst")),
    el("td", {text: r.mode + (r.durable ? ", durable" : "")}), el("td", {text: r.scope}),
    el("td", {}, el("label", {}, shadow, r.shadow ? " shadow" : " enforced"), err("shadow")),
    el("td", {}, save, " ", toggle, err(""), status));
  return tr;
}

function token() {
  return document.getElementById("token").value.trim();
}

// saveRule reads the rule from the rules API, changes the given fields and
// puts it back whole; the API's problem+json errors are shown next to the
// field they name.
async function saveRule(tr, id, changes) {
  for (const e of tr.querySelectorAll(".field-error")) e.textContent = "";
  const status = tr.querySelector(".rule-status");
  status.textContent = "";
  const show = (field, msg) => {
    const e = tr.querySelector('.field-error[data-field="' + field + '"]') || tr.querySelector('.field-error[data-field=""]');
    e.textContent = (e.getAttribute("data-field") === field ? "" : field ? field + ": " : "") + msg;
  };
  const t = token();
  if (!t) { show("", "enter the admin token first"); return; }
  const headers = {"Authorization": "Bearer " + t};
  const url = "v1/rules/" + encodeURIComponent(id);
  try {
    let r = await fetch(url, {headers, cache: "no-store"});
    let body = await r.json().catch(() => ({}));
    if (!r.ok) { showProblem(show, r.status, body); return; }
    const rule = Object.assign({}, body.rule, changes);
    r = await fetch(url, {method: "PUT", headers: Object.assign({"Content-Type": "application/json"}, headers), body: JSON.stringify(rule)});
    body = await r.json().catch(() => ({}));
    if (!r.ok) { showProblem(show, r.status, body); return; }
    tr.removeAttribute("data-dirty");
    rulesDigest = ""; // rebuild on the next poll
    savedMsg[id] = "saved as version " + body.version;
    status.className = "rule-status ok";
    status.textContent = savedMsg[id];
  } catch (err) {
    show("", "request failed: " + err.message);
  }
}

function showProblem(show, code, p) {
  if (p && Array.isArray(p.errors) && p.errors.length) {
    for (const e of p.errors) show(e.field || "", e.message);
    return;
  }
  show("", code + " " + ((p && (p.detail || p.title)) || "error"));
}

// lookup looks id up in the namespace of source (a key chain's source, as
// the top lists name it; none: each rule's first source).
function lookup(id, source) {
  document.getElementById("identity-input").value = id;
  runLookup(source || "");
}

async function runLookup(key) {
  const id = document.getElementById("identity-input").value.trim();
  const path = document.getElementById("identity-path").value.trim();
  const method = document.getElementById("identity-method").value.trim();
  const out = document.getElementById("identity-result");
  const q = new URLSearchParams();
  if (path) q.set("path", path);
  if (method) q.set("method", method);
  if (typeof key === "string" && key) q.set("key", key);
  try {
    const t = token();
    const r = await fetch("v1/identities/" + encodeURIComponent(id) + (q.toString() ? "?" + q : ""),
      {cache: "no-store", headers: t ? {"Authorization": "Bearer " + t} : {}});
    if (r.status === 401) {
      out.replaceChildren(el("p", {class: "error", text: t ? "the admin token was refused" : "this node authenticates lookups: enter the admin token first"}));
      return;
    }
    const rep = await r.json();
    if (!r.ok) { out.replaceChildren(el("p", {class: "error", text: rep.detail || r.status})); return; }
    const head = rep.throttled.length
      ? el("p", {class: "bad", id: "identity-verdict", text: "'" + rep.identity + "' is throttled by: " + rep.throttled.join(", ")})
      : el("p", {class: "ok", id: "identity-verdict", text: "'" + rep.identity + "' is not throttled by any rule now"});
    const rows = rep.rules.map(x => el("tr", {"data-rule": x.rule},
      el("td", {text: x.rule + (x.shadow ? " (shadow)" : "")}),
      el("td", {text: x.key.join(", ")}),
      el("td", {text: x.limit + " / " + x.window + ", burst " + x.burst + " (" + x.limits + ")"}),
      el("td", {text: x.bucket.where + (x.bucket.node ? " " + x.bucket.node : "")}),
      el("td", {text: x.bucket.known ? x.bucket.remaining + " / " + x.bucket.burst : "?"}),
      el("td", {text: String(x.bucket.debt)}),
      el("td", {text: x.recent_allowed + " / " + x.recent_rejected}),
      el("td", {class: "verdict", text: x.verdict})));
    const table = el("table", {id: "identity-table"}, el("thead", {}, el("tr", {},
      ...["rule", "key", "limits", "decided by", "remaining", "debt", "recent ok / rejected", "verdict"].map(h => el("th", {text: h})))),
      el("tbody", {}, ...rows));
    out.replaceChildren(head, table, el("p", {class: "note", text: "Recent counts cover the last " + rep.recent_since + " on " + rep.node + "; rules version " + rep.rules_version + "."}));
  } catch (err) {
    out.replaceChildren(el("p", {class: "error", text: "lookup failed: " + err.message}));
  }
}

document.getElementById("identity-form").addEventListener("submit", ev => { ev.preventDefault(); runLookup(); });
poll();

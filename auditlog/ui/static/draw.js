// auditlog ui: building blocks. Every stored string reaches the page through
// textContent (el() below) or canvas fillText, never as markup: a run named
// "<script>" is shown as those characters.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// append() would write a null as the text "null": put() leaves it out.
function put(node, ...children) {
  for (const child of children.flat()) if (child !== null && child !== undefined && child !== false) node.append(child);
  return node;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") query.set(k, v);
  const url = path + (query.toString() ? "?" + query.toString() : "");
  const response = await fetch(url, {headers: {accept: "application/json"}});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// NaN and infinities arrive as the record writes them ("NaN", "Infinity", "-Infinity").
function num(value) {
  if (value === "NaN") return NaN;
  if (value === "Infinity") return Infinity;
  if (value === "-Infinity") return -Infinity;
  return value;
}

function fmt(value) {
  value = num(value);
  if (value === null || value === undefined) return "";
  if (typeof value === "number") {
    if (Number.isNaN(value)) return "NaN";
    if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    return String(Number(value.toPrecision(6)));
  }
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function duration(seconds) {
  if (typeof seconds !== "number") return "";
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + s.toFixed(1) + "s";
}

function badge(text, tone) { return el("span", {class: "badge " + (tone || "plain")}, text); }

function kvTable(rows) {
  return el("table", {class: "kv"}, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))));
}

function table(columns, rows, numeric) {
  return el("table", {}, el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, rows.map((row) => el("tr", {}, row.map((v, i) =>
      el("td", {class: numeric && numeric[i] ? "num" : null}, v instanceof Node ? v : fmt(v)))))));
}

function shortClass(name) { return String(name || "?").split(".").pop(); }

const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7];
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];

// A line chart of {name: [[step, value], ...]}. Non-finite values are never dropped:
// each is a red dashed line with a triangle at the top of the plot at its step, and
// is listed in text under the chart (.marks).
function lineChart(container, title, series, opts) {
  const names = Object.keys(series || {});
  const box = el("div", {class: "chart", "data-title": title});
  container.append(box);
  const points = names.flatMap((n) => series[n]);
  if (!points.length) { box.append(el("p", {class: "muted"}, title + ": nothing recorded")); return null; }
  const steps = [...new Set(points.map((p) => p[0]))].sort((a, b) => a - b);
  const index = new Map(steps.map((s, i) => [s, i]));
  const marks = [];
  const data = [steps];
  for (const name of names) {
    const ys = new Array(steps.length).fill(null);
    for (const [step, raw] of series[name]) {
      const v = num(raw);
      if (typeof v === "number" && Number.isFinite(v)) ys[index.get(step)] = v;
      else marks.push({step, name, text: fmt(v)});
    }
    data.push(ys);
  }
  const finite = data.slice(1).flat().filter((v) => v !== null);
  const log = finite.length && Math.min(...finite) > 0 && Math.max(...finite) / Math.min(...finite) > 100;
  const width = Math.max(320, Math.min(1100, (container.clientWidth || 900) - 10));
  const plot = new uPlot({
    title, width, height: (opts && opts.height) || 220,
    scales: {x: {time: false}, y: log ? {distr: 3} : {}},
    axes: [{label: "step", incrs: STEP_INCRS}, {}],
    series: [{label: "step"}, ...names.map((n, i) => ({
      label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
      points: {show: steps.length < 80},
    }))],
    hooks: {draw: [(u) => drawMarks(u, marks)]},
  }, data, box);
  if (marks.length) {
    const byName = {};
    for (const m of marks) (byName[m.name + " " + m.text] = byName[m.name + " " + m.text] || []).push(m.step);
    const list = el("p", {class: "marks"});
    for (const [what, at] of Object.entries(byName)) {
      list.append(el("span", {class: "nonfinite-mark", "data-steps": at.join(",")},
        what + " at step" + (at.length > 1 ? "s " : " ") + at.join(", ") + ". "));
    }
    box.append(list);
  }
  return plot;
}

function drawMarks(u, marks) {
  if (!marks.length) return;
  const ctx = u.ctx, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
  ctx.save();
  ctx.strokeStyle = "#d62728"; ctx.fillStyle = "#d62728"; ctx.lineWidth = 2 * devicePixelRatio;
  for (const m of marks) {
    const x = u.valToPos(m.step, "x", true);
    ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]);
    ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
    ctx.setLineDash([]);
    const s = 7 * devicePixelRatio;
    ctx.beginPath(); ctx.moveTo(x - s, top); ctx.lineTo(x + s, top); ctx.lineTo(x, top + 1.6 * s); ctx.closePath(); ctx.fill();
  }
  ctx.restore();
}

// A heatmap panel (rows x steps) on a canvas: log10 for norms, centred on 0 for
// activation means, 0..1 for fractions; red for NaN/Inf, grey where nothing was recorded.
function heatmap(container, panel) {
  const box = el("div", {class: "heat", "data-title": panel.title});
  container.append(box);
  put(box, el("h3", {}, panel.title), panel.note ? el("p", {class: "muted"}, panel.note) : null);
  if (!panel.rows.length) { box.append(el("p", {class: "muted"}, "nothing recorded")); return; }
  const label = 150, cellH = Math.max(10, Math.min(22, Math.floor(420 / panel.rows.length)));
  const width = Math.max(320, Math.min(1100, (container.clientWidth || 900) - 10));
  const cellW = Math.max(1, (width - label) / panel.steps.length);
  const canvas = el("canvas", {width: width, height: cellH * panel.rows.length + 18});
  box.append(canvas);
  const ctx = canvas.getContext("2d");
  const shown = (v) => (panel.scale === "log" ? (v > 0 ? Math.log10(v) : null) : v);
  const values = panel.cells.flat().map(num).filter((v) => typeof v === "number" && Number.isFinite(v)).map(shown).filter((v) => v !== null);
  let lo = Math.min(...values), hi = Math.max(...values);
  if (panel.scale === "fraction") { lo = 0; hi = 1; }
  if (panel.scale === "diverging") { hi = Math.max(Math.abs(lo), Math.abs(hi)) || 1; lo = -hi; }
  const bad = [];
  panel.rows.forEach((row, i) => {
    ctx.fillStyle = "#1d2330"; ctx.font = "11px sans-serif"; ctx.textBaseline = "middle";
    ctx.fillText(row.length > 22 ? row.slice(0, 21) + "…" : row, 2, i * cellH + cellH / 2, label - 6);
    panel.steps.forEach((step, j) => {
      const raw = panel.cells[i][j], v = num(raw);
      if (v === null || v === undefined) ctx.fillStyle = "#dddddd";
      else if (!Number.isFinite(v)) { ctx.fillStyle = "#d62728"; bad.push(row + " at step " + step + ": " + fmt(v)); }
      else { const s = shown(v); ctx.fillStyle = s === null ? "#dddddd" : ramp(hi > lo ? (s - lo) / (hi - lo) : 0.5, panel.scale); }
      ctx.fillRect(label + j * cellW, i * cellH, Math.ceil(cellW), cellH - 1);
    });
  });
  ctx.fillStyle = "#5f6b7a";
  const every = Math.max(1, Math.ceil(panel.steps.length / 12));
  panel.steps.forEach((step, j) => { if (j % every === 0) ctx.fillText(String(step), label + j * cellW, cellH * panel.rows.length + 9); });
  const scale = panel.scale === "log" ? "log10 " : "";
  box.append(el("p", {class: "muted"}, `colour: ${scale}value from ${fmt(lo)} to ${fmt(hi)}; red: NaN/Inf; grey: not recorded`));
  if (bad.length) box.append(el("p", {class: "marks nonfinite-mark"}, bad.slice(0, 12).join("; ") + (bad.length > 12 ? ` and ${bad.length - 12} more` : "")));
}

function ramp(t, scale) {
  t = Math.max(0, Math.min(1, t));
  const stops = scale === "diverging" ? [[94, 60, 153], [247, 247, 247], [230, 97, 1]]
    : scale === "fraction" ? [[239, 243, 255], [8, 81, 156]] : [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const pos = t * (stops.length - 1), k = Math.min(stops.length - 2, Math.floor(pos)), f = pos - k;
  const c = stops[k].map((a, i) => Math.round(a + (stops[k + 1][i] - a) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// The module tree: name, class, parameter counts (own / with children), where it was built,
// and each parameter and buffer with its shape and the snapshot that holds its value then.
function moduleTree(data) {
  const openDepth = data.modules > 200 ? 1 : 3;
  const tensor = (kind, t) => el("li", {class: "tensor"}, el("code", {}, t.name), ` ${kind} [${(t.shape || []).join(", ")}] ${t.dtype || ""}`,
    t.requires_grad === false && kind === "param" ? " frozen" : "",
    t.sha256 ? el("span", {class: "muted mono"}, ` ${t.sha256.slice(0, 10)}@${t.snapshot_step}`) : "");
  const node = (m, depth) => {
    const counts = m.total_parameters ? ` ${fmt(m.total_parameters)} params` + (m.own_parameters && m.own_parameters !== m.total_parameters ? `, ${fmt(m.own_parameters)} own` : "") : "";
    const label = [el("code", {}, m.name === "" ? "(root)" : m.name), " ", shortClass(m.class),
      el("span", {class: "muted"}, counts), m.source ? el("span", {class: "muted mono"}, " " + m.source) : ""];
    const inner = [...m.parameters.map((t) => tensor("param", t)), ...m.buffers.map((t) => tensor("buffer", t)),
      ...m.children.map((c) => node(c, depth + 1))];
    if (!inner.length) return el("li", {"data-module": m.name}, label);
    return el("li", {"data-module": m.name}, el("details", {open: depth < openDepth ? "" : null}, el("summary", {}, label), el("ul", {}, inner)));
  };
  return el("ul", {class: "tree"}, data.roots.map((r) => node(r, 0)));
}

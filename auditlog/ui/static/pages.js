// auditlog ui: the pages (runs, a run, compare, SQL) and the hash router.
"use strict";

const main = document.getElementById("main");
const selected = new Set(); // run ids ticked on the runs page, for compare
let generation = 0; // a page drawn for an older route is dropped

function failed(where, error) {
  where.append(el("p", {class: "error"}, String(error.message || error)));
}

function runLink(id, name) { return el("a", {href: "#/run/" + encodeURIComponent(id)}, name || id.slice(0, 12)); }

// ---------------------------------------------------------------------------- runs
const runsState = {q: "", status: "", sort: "started", order: "desc", offset: 0, limit: 100};

async function runsPage() {
  const mine = generation;
  const filter = el("input", {type: "text", placeholder: "filter: name, id or commit", value: runsState.q, "aria-label": "filter"});
  const status = el("select", {"aria-label": "status"}, el("option", {value: ""}, "any status"));
  const compare = el("button", {type: "button", id: "compare"}, "Compare selected");
  const pager = el("span", {class: "muted"});
  const prev = el("button", {type: "button"}, "‹ prev"), next = el("button", {type: "button"}, "next ›");
  const body = el("div", {});
  clear(main).append(el("h1", {}, "Runs"), el("div", {class: "controls"}, filter, status, compare, prev, next, pager), body);
  const columns = [["", null], ["name", "name"], ["run", null], ["status", "status"], ["steps", "steps"],
    ["commit", "commit"], ["started (UTC)", "started"], ["duration", "duration"], ["signed", "signed"]];
  const updateCompare = () => { compare.textContent = `Compare selected (${selected.size})`; compare.disabled = selected.size < 2; };
  updateCompare();
  compare.addEventListener("click", () => { location.hash = "#/compare?runs=" + [...selected].map(encodeURIComponent).join(","); });
  let timer = null;
  const load = async () => {
    let page;
    try { page = await api("/api/runs", runsState); } catch (e) { clear(body); failed(body, e); return; }
    if (mine !== generation) return;
    if (status.options.length === 1) for (const s of page.statuses) status.append(el("option", {value: s}, s));
    status.value = runsState.status;
    const end = Math.min(page.total, page.offset + page.rows.length);
    pager.textContent = page.total ? `${page.offset + 1}–${end} of ${page.total}` : "no runs match";
    prev.disabled = page.offset === 0; next.disabled = end >= page.total;
    const head = el("tr", {}, columns.map(([label, key]) => {
      const th = el("th", {class: key ? "sortable" + (runsState.sort === key ? " sorted-" + runsState.order : "") : null}, label);
      if (key) th.addEventListener("click", () => {
        runsState.order = runsState.sort === key && runsState.order === "desc" ? "asc" : "desc";
        runsState.sort = key; runsState.offset = 0; load();
      });
      return th;
    }));
    const rows = page.rows.map((r) => {
      const tick = el("input", {type: "checkbox", "aria-label": "select " + r.run_id, checked: selected.has(r.run_id) ? "" : null});
      tick.addEventListener("change", () => { tick.checked ? selected.add(r.run_id) : selected.delete(r.run_id); updateCompare(); });
      const commit = r.git_commit ? r.git_commit.slice(0, 10) + (r.git_dirty ? " (dirty)" : "") : "";
      return el("tr", {"data-run": r.run_id},
        el("td", {}, tick), el("td", {}, runLink(r.run_id, r.name || "(unnamed)")), el("td", {}, el("code", {}, r.run_id.slice(0, 12))),
        el("td", {}, badge(r.status, r.status === "completed" ? "ok" : r.status === "running" ? "plain" : "bad")),
        el("td", {class: "num"}, fmt(r.steps)), el("td", {}, el("code", {}, commit)), el("td", {}, r.started || ""),
        el("td", {class: "num"}, duration(r.duration_s)),
        el("td", {title: "signed checkpoints are stored; the run page's verify verdict checks them"}, r.signed ? "signed" : "unsigned"));
    });
    clear(body).append(el("table", {id: "runs"}, el("thead", {}, head), el("tbody", {}, rows)));
  };
  filter.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { runsState.q = filter.value; runsState.offset = 0; load(); }, 200);
  });
  status.addEventListener("change", () => { runsState.status = status.value; runsState.offset = 0; load(); });
  prev.addEventListener("click", () => { runsState.offset = Math.max(0, runsState.offset - runsState.limit); load(); });
  next.addEventListener("click", () => { runsState.offset += runsState.limit; load(); });
  await load();
}

// ---------------------------------------------------------------------------- a run
async function runPage(selector) {
  const mine = generation;
  clear(main).append(el("p", {class: "muted"}, "Loading run…"));
  let s;
  try { s = await api("/api/runs/" + encodeURIComponent(selector)); } catch (e) { clear(main); failed(main, e); return; }
  if (mine !== generation) return;
  const r = s.run, id = r.run_id;
  const integrity = el("section", {id: "integrity"}, el("h2", {}, "Integrity"), el("p", {class: "muted"}, "verifying…"));
  const verdictBadge = el("span", {});
  const treeBox = el("div", {id: "tree"}), curvesBox = el("section", {id: "curves"}, el("h2", {}, "Training"));
  const git = (s.metadata && s.metadata.git) || {};
  const code = r.git_commit ? `${r.git_commit} on ${r.git_branch || "?"}${r.git_dirty ? " with uncommitted changes" : ""}` : "no git repository";
  put(clear(main),
    el("h1", {}, r.name || "(unnamed run)"),
    el("p", {}, el("code", {}, id), " ", badge(r.status, r.status === "completed" ? "ok" : "bad"), " ", verdictBadge,
      " ", el("a", {href: "#/query?run=" + encodeURIComponent(id)}, "SQL over this run")),
    el("section", {id: "summary"}, el("h2", {}, "Run"), kvTable([
      ["command", (r.argv || []).join(" ")], ["code version", code + (git.diff_sha256 ? ` (diff sha256 ${git.diff_sha256})` : "")],
      ["started (UTC)", r.started || ""], ["ended (UTC)", r.ended || ""], ["duration", duration(r.duration_s)],
      ["status", r.status + (r.status_detail ? ` (${r.status_detail})` : "") + (r.exit_code !== null && r.exit_code !== undefined ? `, exit code ${r.exit_code}` : "")],
      ["steps / events", `${fmt(r.steps)} / ${fmt(r.events)}`], ["host / user", `${r.host || "?"} / ${r.user || "?"}`],
      ["python / torch / CUDA", `${r.python || "?"} / ${r.torch || "?"} / ${r.cuda || "none"}`],
      ["seed at start", fmt(r.seed)], ["parameters", `${fmt(s.totals.total)} (${fmt(s.totals.trainable)} trainable, ${fmt(s.totals.tensors)} tensors)`],
    ])),
    gapsSection(s.gaps || []),
    integrity,
    el("section", {id: "model"}, el("h2", {}, "Model"), treeBox),
    curvesBox,
    nonfiniteSection(s.finding),
    snapshotsSection(s),
    dataSection(s.data),
    annotationsSection(s.annotations),
  );
  drawTree(treeBox, id, s.last_step);
  api("/api/runs/" + encodeURIComponent(id) + "/verify").then((v) => {
    if (mine !== generation) return;
    verdictBadge.append(badge(v.badge, v.tone));
    put(clear(integrity), el("h2", {}, "Integrity"), el("p", {id: "verdict"}, badge(v.badge, v.tone), " ", el("code", {}, "auditlog verify"), ": " + v.text),
      v.problems.length ? el("ul", {}, v.problems.map((p) => el("li", {}, el("code", {}, p)))) : null,
      v.note ? el("p", {class: "muted"}, v.note) : null);
  }).catch((e) => { clear(integrity).append(el("h2", {}, "Integrity")); failed(integrity, e); });
  api("/api/runs/" + encodeURIComponent(id) + "/curves").then((c) => {
    if (mine !== generation) return;
    for (const p of [...c.loss, ...c.lr, ...c.grad_norm]) lineChart(curvesBox, p.title, p.series);
    for (const p of [...c.update_ratio, ...c.activations]) heatmap(curvesBox, p);
  }).catch((e) => failed(curvesBox, e));
}

function drawTree(box, id, lastStep) {
  const slider = el("input", {type: "range", min: 0, max: lastStep, value: lastStep, step: 1, id: "step", "aria-label": "step"});
  const label = el("span", {id: "step-label"}), counts = el("p", {id: "tree-counts", class: "muted"});
  const holder = el("div", {class: "scroll"});
  box.append(el("div", {class: "controls"}, el("span", {}, "state after step"), slider, label), counts, holder);
  let timer = null, asked = 0;
  const load = async () => {
    const step = Number(slider.value), mine = ++asked;
    label.textContent = `${step} of ${lastStep}` + (step === 0 ? " (sealed initial state)" : "");
    let t;
    try { t = await api("/api/runs/" + encodeURIComponent(id) + "/tree", {step}); } catch (e) { clear(holder); failed(holder, e); return; }
    if (mine !== asked) return;
    counts.textContent = `${fmt(t.modules)} modules, ${fmt(t.parameters)} parameters at step ${t.step}`;
    clear(holder).append(moduleTree(t));
    box.dataset.step = String(t.step);
  };
  slider.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(load, 120); });
  load();
}

// What the record says it does not hold (work that ran where no hook saw it), as the report says it.
function gapsSection(gaps) {
  if (!gaps.length) return null;
  return el("section", {id: "gaps"}, el("h2", {}, "Not in the record"),
    el("ul", {}, gaps.map((g) => el("li", {}, badge("gap", "bad"), " " + g))));
}

function nonfiniteSection(f) {
  const box = el("section", {id: "nonfinite"}, el("h2", {}, "Non-finite values"));
  box.append(el("p", {}, f.found ? badge("NaN/Inf at step " + f.step, "bad") : badge("none found", "ok")));
  for (const line of f.explanation || []) box.append(el("p", {}, line));
  const calls = [];
  if (f.producer) calls.push(["producer", f.producer]);
  for (const c of f.propagators || []) calls.push(["propagated", c]);
  for (const c of f.enclosing || []) calls.push(["enclosing", c]);
  if (calls.length) box.append(table(["role", "module", "class", "built at"], calls.map(([role, c]) => [role, c.module, shortClass(c.class), c.source])));
  if ((f.parameters || []).length) box.append(el("p", {}, "Non-finite gradients: " + f.parameters.map((p) => p.parameter).join(", ")));
  return box;
}

function snapshotsSection(s) {
  const box = el("section", {id: "snapshots"}, el("h2", {}, "Snapshots"));
  if (!s.snapshots.length) { box.append(el("p", {class: "muted"}, "No snapshot was stored (record with snapshot_every).")); return box; }
  box.append(el("p", {class: "muted"}, `${s.snapshots.length} snapshots, ${fmt(s.snapshot_bytes)} distinct bytes stored. Restore a state_dict with the command beside it.`));
  box.append(table(["step", "trigger", "module", "tensors", "bytes", "restore"],
    s.snapshots.map((x) => [x.step, x.trigger, x.module, x.tensors, x.logical_bytes, el("code", {}, x.restore)]), [true, false, false, true, true, false]));
  return box;
}

// The datasets and loaders as `auditlog data RUN` shows them (the server sends its columns).
function dataSection(d) {
  const box = el("section", {id: "data"}, el("h2", {}, "Data"));
  if (!d.datasets.rows.length) {
    box.append(el("p", {class: "muted"}, "No DataLoader iteration was recorded in this run."));
    return box;
  }
  const grid = (part) => table(part.columns, part.rows.map((r) => part.columns.map((c) => r[c])));
  box.append(el("h3", {}, "Datasets"), grid(d.datasets), el("h3", {}, "Loaders"), grid(d.loaders));
  box.append(el("p", {class: "muted"}, "Which steps trained on one sample: ", el("code", {}, "auditlog data RUN --sample I")));
  return box;
}

function annotationsSection(items) {
  const box = el("section", {id: "annotations"}, el("h2", {}, "Annotations"));
  if (!items.length) { box.append(el("p", {class: "muted"}, "No annotations (run.annotate(key, **fields)).")); return box; }
  box.append(table(["key", "step", "time (UTC)", "fields"], items.map((a) => [a.key, a.step, a.time, a.fields]), [false, true, false, false]));
  return box;
}

// ---------------------------------------------------------------------------- compare
const SYMBOLS = {added: ["+", "add"], removed: ["-", "rem"], changed: ["~", "chg"], renamed: ["→", "chg"], moved: ["↕", "muted"]};
const SECTIONS = [["code", "Code version"], ["modules", "Modules"], ["parameters", "Parameters"], ["buffers", "Buffers"],
  ["hyperparameters", "Hyperparameters"], ["metadata", "Run metadata"]];

async function comparePage(ids) {
  const mine = generation;
  clear(main).append(el("p", {class: "muted"}, "Comparing…"));
  let c;
  try { c = await api("/api/compare", {runs: ids.join(",")}); } catch (e) { clear(main); failed(main, e); return; }
  if (mine !== generation) return;
  const letters = c.runs.map((_, i) => String.fromCharCode(65 + i));
  const charts = el("section", {id: "compare-curves"}, el("h2", {}, "Curves"));
  clear(main).append(el("h1", {}, `Compare ${c.runs.length} runs`),
    table(["", "name", "run", "status", "steps", "commit"], c.runs.map((r, i) => [letters[i], runLink(r.run_id, r.name || "(unnamed)"),
      el("code", {}, r.run_id.slice(0, 12)), r.status, r.steps, r.git_commit ? r.git_commit.slice(0, 10) + (r.git_dirty ? " (dirty)" : "") : ""])),
    charts);
  for (const key of ["loss", "lr", "grad_norm"]) {
    const merged = {};
    c.runs.forEach((r, i) => { for (const [name, pts] of Object.entries(r.curves[key].series)) merged[`${letters[i]}: ${name}`] = pts; });
    lineChart(charts, c.runs[0].curves[key].title, merged);
  }
  c.diffs.forEach((d, k) => main.append(diffSection(d, "A", letters[k + 1])));
}

function diffSection(d, a, b) {
  const box = el("section", {class: "diff"}, el("h2", {}, `Construction and settings: ${a} → ${b}`));
  box.append(el("p", {}, d.identical ? badge("identical construction and settings", "ok") : badge("differences found", "warn")));
  for (const [key, title] of SECTIONS) {
    const changes = d[key] || [];
    if (!changes.length) continue;
    box.append(el("h3", {}, `${title} (${changes.length})`));
    box.append(table(["", "name", "what changed"], changes.map((ch) => {
      const [symbol, tone] = SYMBOLS[ch.change] || ["?", "muted"];
      const fields = Object.entries(ch.fields || {}).map(([f, v]) => `${f}: ${fmt(v.a)} → ${fmt(v.b)}`).join("; ");
      const side = ch.change === "added" ? ch.b : ch.change === "removed" ? ch.a : null;
      const what = fields || (side ? Object.entries(side).map(([k, v]) => `${k}=${fmt(v)}`).join(", ") : ch.change);
      return [el("span", {class: tone}, symbol), ch.name + (ch.new_name ? " → " + ch.new_name : ""), what];
    })));
  }
  if ((d.init_values_differ || []).length) {
    box.append(el("p", {class: "muted"}, `${d.init_values_differ.length} tensors drawn again from the same distribution: ${d.init_values_differ.join(", ")}`));
  }
  const out = el("div", {});
  const ask = el("button", {type: "button"}, "Compare snapshotted values (diff --values)");
  ask.addEventListener("click", async () => {
    ask.disabled = true; clear(out).append(el("p", {class: "muted"}, "comparing values…"));
    try {
      const v = await api("/api/compare/values", {a: d.a.run_id, b: d.b.run_id});
      const f = v.first_divergence;
      const first = f ? `first divergence at step ${f.step}: ${f.tensor} (${f.reason}${f.max_abs_diff !== undefined ? ", max abs diff " + fmt(f.max_abs_diff) : ""})`
        : "identical at every step compared";
      clear(out).append(el("p", {class: "values"}, `${v.mode}: ${fmt(v.tensors_compared)} tensors compared at steps ${(v.steps_compared || []).join(", ")}; ${first}`));
    } catch (e) { clear(out); failed(out, e); }
    ask.disabled = false;
  });
  box.append(ask, out);
  return box;
}

// ---------------------------------------------------------------------------- SQL
async function queryPage(run) {
  const sql = el("textarea", {id: "sql", "aria-label": "SQL", spellcheck: "false"});
  sql.value = "select kind, count(*) as n from events group by kind order by n desc";
  const scope = el("input", {type: "text", id: "scope", placeholder: "all runs, or a run: id, name, latest", value: run || ""});
  const go = el("button", {type: "button", id: "run-query"}, "Run query");
  const out = el("div", {id: "result"}), views = el("details", {}, el("summary", {}, "Views and columns"));
  clear(main).append(el("h1", {}, "SQL"),
    el("p", {class: "muted"}, "One read-only statement over the documented views, in the sandbox of auditlog query (DuckDB, no files, no writes)."),
    sql, el("div", {class: "controls"}, el("span", {}, "run"), scope, go), out, views);
  go.addEventListener("click", async () => {
    go.disabled = true; clear(out).append(el("p", {class: "muted"}, "running…"));
    try {
      const r = await api("/api/query", {sql: sql.value, run: scope.value});
      clear(out).append(el("p", {class: "muted"}, `${r.rows.length} rows${r.more ? " (the first ones; more matched)" : ""}`),
        el("div", {class: "scroll"}, table(r.columns, r.rows)));
    } catch (e) { clear(out); failed(out, e); }
    go.disabled = false;
  });
  api("/api/schema").then((list) => {
    for (const v of list) views.append(el("p", {}, el("code", {}, v.view), ": " + v.doc + " ", el("span", {class: "muted"}, v.columns.map((c) => c.name).join(", "))));
  }).catch((e) => failed(views, e));
}

// ---------------------------------------------------------------------------- router
function route() {
  generation += 1;
  const hash = location.hash.replace(/^#/, "") || "/runs";
  const [path, search] = hash.split("?");
  const params = new URLSearchParams(search || "");
  if (path.startsWith("/run/")) return runPage(decodeURIComponent(path.slice(5)));
  if (path === "/compare") return comparePage((params.get("runs") || "").split(",").filter(Boolean));
  if (path === "/query") return queryPage(params.get("run"));
  return runsPage();
}

window.addEventListener("hashchange", route);
route();

// The report page's app, inlined by galapagos/reports/html.py after plotly.js and the data block. It draws every
// plot of the data block with plotly.js (Plotly.react, so a redraw with new data keeps the user's zoom), fills the
// table, and shows a candidate's genome on click; the live page (report --serve) polls the data and redraws.
// Marks on <body> what it drew, for the tests in a headless browser: data-plots (plots on the page), data-rendered
// (plots plotly drew), data-evaluations (evaluations drawn), data-picked (the evaluation last clicked).
const $ = (s, e = document) => e.querySelector(s);
const esc = s => String(s ?? "").replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
const fmt = v => v == null ? "-" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v);
const CONFIG = {responsive: true, displaylogo: false};
const FONT = {family: "system-ui, sans-serif", size: 13};
let DATA = JSON.parse($("#galapagos-data").textContent), BYID = {};

function layout(extra) {
  return Object.assign({font: FONT, margin: {l: 70, r: 30, t: 40, b: 55}, hovermode: "closest",
    legend: {orientation: "h", x: 0, y: 1.02, yanchor: "bottom"}, hoverlabel: {align: "left"}, uirevision: "keep"},
    extra);
}
function section(id, title) {
  let s = document.getElementById("sec-" + id);
  if (!s) { s = document.createElement("section"); s.id = "sec-" + id;
    s.innerHTML = `<h2>${esc(title)}</h2>`; $("#app").appendChild(s); }
  return s;
}
function plot(sec, id, caption, traces, lay, height) {
  let f = document.getElementById("fig-" + id);
  if (!f) { f = document.createElement("figure"); f.id = "fig-" + id;
    f.innerHTML = `<div class="plot" id="plot-${id}"></div><figcaption></figcaption>`; sec.appendChild(f); }
  $("figcaption", f).textContent = caption;
  const div = $(".plot", f);
  div.style.height = (height || 420) + "px";
  Plotly.react(div, traces, layout(lay), CONFIG);
  if (!div.dataset.bound) { div.dataset.bound = 1; div.on("plotly_click", e => {
    const p = e.points[0]; const id = Array.isArray(p.customdata) ? p.customdata[0] : p.customdata;
    if (id != null && BYID[id]) pick(id); }); }
}
function text(sec, id, body) {
  let p = document.getElementById("pre-" + id);
  if (!p) { p = document.createElement("pre"); p.id = "pre-" + id; sec.appendChild(p); }
  p.textContent = body;
}
function hover(e) {
  return `#${e.id} ${e.status} \u00b7 fitness ${fmt(e.fitness)} \u00b7 ${e.size == null ? "-" : e.size.toLocaleString()} parameters` +
    `<br>${esc(e.network).replace(" | ", "<br>")}` +
    (e.metrics.val_loss != null ? `<br>val_loss ${fmt(e.metrics.val_loss)}` : "") +
    (e.metrics.latency_ms != null ? ` \u00b7 latency ${fmt(e.metrics.latency_ms)} ms` : "") +
    (e.origin ? `<br>origin ${esc(e.origin)}${e.parents.length ? " of #" + e.parents.join(", #") : ""}` : "") +
    (e.error ? `<br>${esc(e.error).slice(0, 120)}` : "");
}
function points(evs, x, y, extra) {
  return Object.assign({x: evs.map(x), y: evs.map(y), customdata: evs.map(e => e.id), text: evs.map(hover),
    hovertemplate: "%{text}<extra></extra>"}, extra);
}
function byStatus(evs) {
  const out = {};
  for (const e of evs) (out[e.status] = out[e.status] || []).push(e);
  return out;
}
function color(s) { return DATA.colors[s] || "#999"; }
function bestSoFar(evs) {
  let best = null; const x = [], y = [];
  for (const e of evs) { if (e.status === "ok" && e.fitness != null && (best == null || e.fitness > best)) best = e.fitness;
    if (e.end != null) { x.push(e.end); y.push(best); } }
  return {x, y};
}

function drawRun() {
  const evs = DATA.evaluations, groups = byStatus(evs), sec = section("search", "Search");
  text(sec, "summary", DATA.summary + (DATA.busy.share != null ? `\nworkers busy: ${(100 * DATA.busy.share).toFixed(1)}% ` +
    `of ${DATA.busy.workers} worker(s) between the first evaluation's start and the last one's end ` +
    `(${DATA.busy.minutes.toFixed(1)} min; the utilization above also counts the job's start-up)` : ""));
  // every evaluation over time
  const tr = Object.entries(groups).map(([s, g]) => points(g.filter(e => e.end != null && e.fitness != null),
    e => e.end, e => e.fitness, {type: "scatter", mode: "markers", name: s, marker: {color: color(s), size: 7, opacity: .8}}));
  const b = bestSoFar(evs);
  tr.push({type: "scatter", mode: "lines", x: b.x, y: b.y, name: "best so far", line: {shape: "hv", color: "#264653", width: 2},
    hoverinfo: "skip"});
  if (DATA.compare) { const c = bestSoFar(DATA.compare.evaluations);
    tr.push({type: "scatter", mode: "lines", x: c.x, y: c.y, name: `best so far: ${DATA.compare.name}`,
      line: {shape: "hv", color: "#888", dash: "dash", width: 2}, hoverinfo: "skip"}); }
  plot(sec, "evaluations", "Every evaluation by the time it finished, coloured by status (pruned candidates at the fitness they " +
    "had when stopped), with the best fitness so far" + (DATA.compare ? `, beside ${DATA.compare.name}` : "") +
    ". Hover a point for its network, click it for its genome.", tr,
    {xaxis: {title: {text: "minutes since the first start"}, rangemode: "tozero"}, yaxis: {title: {text: "fitness"}}});
  // intermediate values: a trace per status, the candidates' curves in it apart (null between), so that a run of
  // thousands draws quickly
  const curves = evs.filter(e => e.curve.length), maxEpoch = Math.max(1, ...curves.map(e => e.curve.length));
  const ctr = Object.keys(groups).filter(s => curves.some(e => e.status === s)).map(s => {
    const t = {type: "scatter", mode: "lines+markers", name: s, x: [], y: [], customdata: [], text: [],
      hovertemplate: "epoch %{x}: %{y:.4f}<br>%{text}<extra></extra>", line: {color: color(s), width: 1},
      marker: {size: 4}, opacity: s === "ok" ? .75 : .55};
    for (const e of curves.filter(e => e.status === s)) {
      const label = hover(e);
      e.curve.forEach((v, i) => { t.x.push(i + 1); t.y.push(v); t.customdata.push(e.id); t.text.push(label); });
      t.x.push(null); t.y.push(null); t.customdata.push(null); t.text.push("");
    }
    return t; });
  plot(sec, "curves", `Intermediate values: the fitness after each epoch of all ${curves.length} candidates that reported one, ` +
    "pruned ones included (where their curve stops)", ctr,
    {xaxis: {title: {text: "epoch"}, tickmode: "linear", dtick: maxEpoch > 20 ? 5 : 1, tick0: 1, range: [0.8, maxEpoch + .2]},
     yaxis: {title: {text: "validation fitness"}}});
  // costs and the Pareto front
  for (const [cost, label, get] of [["params", "parameters", e => e.size], ["latency", "latency (ms per sample)", e => e.metrics.latency_ms]]) {
    const ok = evs.filter(e => e.status === "ok" && e.fitness != null && get(e) != null);
    if (cost === "latency" && !ok.length) continue;
    const front = DATA.fronts[cost].map(i => BYID[i]).filter(Boolean);
    plot(sec, "cost-" + cost, `Fitness against ${label} (log scale) of the evaluations that succeeded, with the Pareto front ` +
      `of the two: the ${front.length} networks that no other beats on both (fitter and cheaper)`,
      [points(ok, get, e => e.fitness, {type: "scatter", mode: "markers", name: "evaluations", marker: {color: color("ok"), size: 7, opacity: .6}}),
       points(front, get, e => e.fitness, {type: "scatter", mode: "lines+markers", name: "Pareto front", line: {shape: "hv", color: "#264653"},
         marker: {size: 9, color: "#264653"}})],
      {xaxis: {title: {text: label}, type: "log"}, yaxis: {title: {text: "fitness"}}});
  }
  if (DATA.pareto_text) text(sec, "pareto", DATA.pareto_text);
  // parameter importance
  const imp = DATA.importance;
  if (imp.length) plot(sec, "importance", "Parameter importance: " + IMPORTANCE, [{type: "bar", orientation: "h",
    x: imp.map(d => d.eta2), y: imp.map(d => d.name), marker: {color: "#264653"}, hovertemplate: "%{y}: %{x:.3f}<extra></extra>"}],
    {xaxis: {title: {text: "correlation ratio \u03b7\u00b2"}, range: [0, 1]}, margin: {l: 140, r: 30, t: 20, b: 55}, showlegend: false},
    Math.max(260, 28 * imp.length + 90));
  // parallel coordinates
  const pok = evs.filter(e => e.status === "ok" && e.fitness != null);
  const names = imp.slice(-8).map(d => d.name);
  if (pok.length >= 2 && names.length) {
    const dims = names.map(n => { const v = pok.map(e => e.params[n]);
      if (v.every(x => x == null || typeof x === "number")) {
        const log = n === "lr" || n === "weight_decay";
        return log ? {label: n + " (log10)", values: v.map(x => x > 0 ? Math.log10(x) : null)} : {label: n, values: v}; }
      const cats = [...new Set(v.map(String))].sort();
      return {label: n, values: v.map(x => cats.indexOf(String(x))), tickvals: cats.map((_, i) => i), ticktext: cats}; });
    dims.push({label: "fitness", values: pok.map(e => e.fitness)});
    plot(sec, "parallel", "Parallel coordinates: one line per evaluation that succeeded, through its genome's " +
      `${names.length} most important parameters (the most important last, next to fitness), coloured by fitness; ` +
      "drag along an axis to filter", [{type: "parcoords",
      line: {color: pok.map(e => e.fitness), colorscale: "Viridis", showscale: true, colorbar: {title: {text: "fitness"}}},
      dimensions: dims}], {margin: {l: 60, r: 60, t: 60, b: 30}}, 460);
  }
  // worker timeline
  const timed = evs.filter(e => e.start != null && e.end != null);
  const ranks = [...new Set(timed.map(e => e.rank))].sort((a, b) => a - b);
  const ttr = Object.entries(byStatus(timed)).map(([s, g]) => points(g, e => e.end - e.start, e => `rank ${e.rank}`,
    {type: "bar", orientation: "h", base: g.map(e => e.start), name: s, textposition: "none", marker: {color: color(s), line: {color: "#fff", width: .5}}}));
  plot(sec, "timeline", "Worker timeline: a row per worker rank, a bar per evaluation from its start to its end, coloured by status",
    ttr, {barmode: "overlay", xaxis: {title: {text: "minutes since the first start"}, rangemode: "tozero"},
      yaxis: {categoryorder: "array", categoryarray: ranks.map(r => `rank ${r}`), autorange: "reversed"}, bargap: .25},
    Math.max(220, 32 * ranks.length + 140));
  // genealogy
  const g = DATA.genealogy, pos = Object.fromEntries(g.nodes.map(n => [n.id, n]));
  const ex = [], ey = [];
  for (const [c, p] of g.edges) { ex.push(pos[c].x, pos[p].x, null); ey.push(pos[c].y, pos[p].y, null); }
  const nodes = g.nodes.map(n => BYID[n.id]).filter(Boolean), gen = Math.max(1, ...g.nodes.map(n => -n.y + 1));
  plot(sec, "genealogy", "Genealogy of the best network (top) and its ancestors, a row per generation back; labels are " +
    "evaluation ids and fitness, hover for the network, zoom in on a crowded row", [
    {type: "scatter", mode: "lines", x: ex, y: ey, line: {color: "#bbb", width: 1}, hoverinfo: "skip", showlegend: false},
    points(nodes, e => pos[e.id].x, e => pos[e.id].y, {type: "scatter", mode: "markers+text", text: nodes.map(e => `#${e.id} ${fmt(e.fitness)}`),
      textposition: "top center", textfont: {size: 12}, hovertext: nodes.map(hover), hovertemplate: "%{hovertext}<extra></extra>",
      marker: {size: 14, color: nodes.map(e => color(e.status)), line: {color: "#264653", width: 1}}, showlegend: false})],
    {xaxis: {visible: false}, yaxis: {visible: false, range: [-gen + .5, .6]}, margin: {l: 20, r: 20, t: 20, b: 20}},
    Math.max(260, 90 * gen));
  // counts by status
  const st = Object.keys(groups).sort((a, b) => groups[b].length - groups[a].length);
  plot(sec, "status", "Evaluations by status", [{type: "bar", x: st, y: st.map(s => groups[s].length),
    marker: {color: st.map(color)}, hovertemplate: "%{x}: %{y}<extra></extra>"}],
    {yaxis: {title: {text: "evaluations"}}, showlegend: false}, 300);
  table(section("table", "Evaluations"), evs);
}

const COLUMNS = [["id", e => e.id], ["status", e => e.status], ["fitness", e => e.fitness], ["parameters", e => e.size],
  ["epochs", e => e.curve.length], ["seconds", e => e.seconds], ["finished (UTC)", e => e.finished], ["rank", e => e.rank],
  ["origin", e => e.origin], ["parents", e => e.parents.join(" ")], ["network", e => e.network]];
let SORT = {col: 0, dir: 1};
function table(sec, evs) {
  let box = document.getElementById("evaluations");
  if (!box) { box = document.createElement("div"); box.className = "scroll"; box.id = "evaluations"; sec.appendChild(box);
    const cap = document.createElement("p"); cap.textContent = "Click a column to sort, a row to see its genome.";
    sec.insertBefore(cap, box); }
  const [, get] = COLUMNS[SORT.col];
  const rows = [...evs].sort((a, b) => { const x = get(a), y = get(b);
    return (x == null) - (y == null) || SORT.dir * (x < y ? -1 : x > y ? 1 : 0); });
  box.innerHTML = "<table><thead><tr>" + COLUMNS.map(([n], i) => `<th data-col="${i}">${esc(n)}${i === SORT.col ?
    (SORT.dir > 0 ? " \u25b2" : " \u25bc") : ""}</th>`).join("") + "</tr></thead><tbody>" +
    rows.map(e => `<tr id="row-${e.id}" data-id="${e.id}">` + COLUMNS.map(([n, f]) =>
      `<td${n === "network" ? ' class="net"' : ""}>${esc(fmt(f(e)))}</td>`).join("") + "</tr>").join("") + "</tbody></table>";
  box.querySelectorAll("th").forEach(th => th.onclick = () => { const c = +th.dataset.col;
    SORT = {col: c, dir: SORT.col === c ? -SORT.dir : 1}; table(sec, evs); });
  box.querySelectorAll("tbody tr").forEach(tr => tr.onclick = () => pick(+tr.dataset.id, false));
}
function pick(id, scroll = true) {
  const e = BYID[id], box = $("#selected");
  box.hidden = false;
  $("div", box).innerHTML = `<b>#${e.id}</b> ${esc(e.status)}, fitness ${fmt(e.fitness)}, ${fmt(e.size)} parameters` +
    `<pre>${esc(e.network)}</pre><b>genome</b><pre>${esc(JSON.stringify(e.genome, null, 1))}</pre>` +
    `<b>metrics</b><pre>${esc(Object.entries(e.metrics).map(([k, v]) => `${k}: ${fmt(v)}`).join("\n"))}</pre>`;
  document.querySelectorAll("tr.picked").forEach(r => r.classList.remove("picked"));
  const row = document.getElementById("row-" + id);
  if (row) { row.classList.add("picked"); if (scroll) row.scrollIntoView({block: "nearest"}); }
  document.body.dataset.picked = id;
}

function drawEnsemble(E) {
  const sec = section("ensemble", "Ensemble");
  text(sec, "ensemble", E.summary);
  const names = E.members.map(m => m.name), nets = E.members.map(m => esc(m.network));
  plot(sec, "weights", "The members' weights in the ensemble (greedy selection on val)", [{type: "bar", x: names,
    y: E.members.map(m => m.weight), text: nets, textposition: "none", hovertemplate: "%{x}: weight %{y:.3f}<br>%{text}<extra></extra>",
    marker: {color: "#264653"}}], {yaxis: {title: {text: "weight"}}, showlegend: false}, 320);
  const scores = E.members.map(m => m.score);
  const lo = Math.min(...scores, E.ensemble_score);
  plot(sec, "members", `The ensemble against each member: ${E.split} ${E.key}`, [{type: "bar", x: [...names, "ensemble"],
    y: [...scores, E.ensemble_score], text: [...nets, "weighted average of the members"], textposition: "none",
    hovertemplate: "%{x}: %{y:.4f}<br>%{text}<extra></extra>", marker: {color: [...names.map(() => "#8ab17d"), "#e76f51"]}}],
    {yaxis: {title: {text: `${E.split} ${E.key}`}, range: E.task === "classification" ? [Math.max(0, lo - .1), 1] : null},
     showlegend: false}, 340);
  if (E.note) text(sec, "note", E.note);
  if (E.diversity) { const u = E.used;
    plot(sec, "diversity", `The members' diversity on ${E.split}: ${E.diversity.what}`, [{type: "heatmap", x: u, y: u,
      z: E.diversity.matrix, colorscale: "Viridis", hovertemplate: "%{y} and %{x}: %{z:.3f}<extra></extra>",
      colorbar: {title: {text: E.task === "classification" ? "disagree" : "error corr."}}}],
      {yaxis: {autorange: "reversed"}, margin: {l: 110, r: 30, t: 20, b: 90}}, Math.max(300, 40 * u.length + 140)); }
  if (E.calibration) { const c = E.calibration;
    plot(sec, "calibration", `Calibration of the ensemble on ${E.split}: accuracy against confidence in 10 bins (the diagonal is perfect)`,
      [{type: "scatter", mode: "lines", x: [0, 1], y: [0, 1], line: {dash: "dot", color: "#999"}, name: "perfectly calibrated", hoverinfo: "skip"},
       {type: "scatter", mode: "lines+markers", x: c.confidence, y: c.accuracy, text: c.count, name: "ensemble",
        hovertemplate: "confidence %{x:.3f}: accuracy %{y:.3f} (%{text} samples)<extra></extra>", line: {color: "#e76f51"}}],
      {xaxis: {title: {text: "confidence"}, range: [0, 1]}, yaxis: {title: {text: "accuracy"}, range: [0, 1.02]}}, 380);
    const u = E.uncertainty;
    plot(sec, "uncertainty", `Uncertainty: predictive entropy of right and wrong predictions on ${E.split}`,
      [{type: "bar", x: u.centers, y: u.right, name: "right", marker: {color: "#2a9d8f"}, opacity: .7},
       {type: "bar", x: u.centers, y: u.wrong, name: "wrong", marker: {color: "#e76f51"}, opacity: .7}],
      {barmode: "overlay", xaxis: {title: {text: "predictive entropy (nats)"}}, yaxis: {title: {text: "samples"}}}, 340); }
  if (E.regression) { const r = E.regression, lo = Math.min(...r.y), hi = Math.max(...r.y);
    plot(sec, "calibration", `Predictions of the ensemble on ${E.split} (first target), \u00b1 the between-member std`,
      [{type: "scatter", mode: "lines", x: [lo, hi], y: [lo, hi], line: {dash: "dot", color: "#999"}, name: "exact", hoverinfo: "skip"},
       {type: "scatter", mode: "markers", x: r.y, y: r.pred, name: "samples", marker: {size: 4, color: "#264653", opacity: .5},
        error_y: {type: "data", array: r.std, visible: true, thickness: .5, width: 0}}],
      {xaxis: {title: {text: "true"}}, yaxis: {title: {text: "predicted"}}}, 400);
    plot(sec, "uncertainty", "Uncertainty against error: between-member std and absolute error per sample",
      [{type: "scatter", mode: "markers", x: r.std, y: r.y.map((y, i) => Math.abs(r.pred[i] - y)), name: "samples",
        marker: {size: 4, color: "#e76f51", opacity: .5}}],
      {xaxis: {title: {text: "between-member std"}}, yaxis: {title: {text: "absolute error"}}, showlegend: false}, 360); }
}

function draw() {
  BYID = Object.fromEntries((DATA.evaluations || []).map(e => [e.id, e]));
  $("#made").innerHTML = `${DATA.kind} \u00b7 ${(DATA.evaluations || []).length ? DATA.evaluations.length + " evaluations \u00b7 " : ""}` +
    `made ${esc(DATA.made)}` + (window.GALAPAGOS_LIVE ? ' \u00b7 <span class="live">live: refreshes as the journal grows</span>' : "");
  if (DATA.evaluations) drawRun();
  if (DATA.ensemble) drawEnsemble(DATA.ensemble);
  const plots = document.querySelectorAll(".plot");
  document.body.dataset.plots = plots.length;
  document.body.dataset.rendered = [...plots].filter(p => p.querySelector(".main-svg")).length;
  document.body.dataset.evaluations = (DATA.evaluations || []).length;
}
const IMPORTANCE = DATA.importance_method || "";
draw();
$("#close").onclick = () => { $("#selected").hidden = true; };
if (window.GALAPAGOS_LIVE) {
  const poll = async () => {
    try { const r = await fetch(window.GALAPAGOS_LIVE + "?since=" + DATA.version, {cache: "no-store"});
      if (r.status === 200) { const d = await r.json(); if (d.version !== DATA.version) { const {ensemble, kind} = DATA;
        DATA = d; if (ensemble && !DATA.ensemble) Object.assign(DATA, {ensemble, kind}); draw(); } } } catch (err) { /* server gone */ }
    setTimeout(poll, 2000);
  };
  setTimeout(poll, 2000);
}

// depthlens view: one response — its tokens coloured by settling depth, a token's divergence across layers, and
// the token × layer heatmap (a cell's layer predictions and the logit lens: lens.js). The chart and the heatmap are drawn here (an SVG polyline, a canvas): one line per
// token and one cell per token × layer need nothing a charting library would add.
"use strict";

let RESPONSE = null;   // /api/response
let SELECTED = null;   // the selected token's index

function depthShade(depth) {
  return (depth - 1) / Math.max(1, RESPONSE.n_layers - 1);
}

function divergenceRow(t) {
  const L = RESPONSE.n_layers;
  return Array.from(RESPONSE.divergence.subarray(t * L, (t + 1) * L));  // a plain array: .map may return anything
}

async function responseView(main, rid, params, mine) {
  const data = await getJSON("/api/response?" + new URLSearchParams({id: rid}));
  if (mine !== generation) return;
  data.divergence = decodeFloats(data.divergence);
  RESPONSE = data;
  SELECTED = null;
  LAYER = null;
  const f = data.fields;
  const qid = f.question_id;
  const crumbs = el("p", {class: "crumbs"}, el("a", {href: href([], keep(params))}, "run"),
    qid !== undefined && qid !== null ? [" › ", el("a", {href: href(["q", String(qid)], keep(params))}, `question ${qid}`)] : "",
    data.kind === "scores" ? " › record" : " › response");
  const dtr = data.readout ? data.deep.filter(Boolean).length / data.readout : null;
  const made = data.kind === "scores" ? "scored" : "generated";  // a score store's record was given, not sampled
  const facts = data.kind === "tcb"
    ? [["tokens", `${data.tokens.length} generated`], ["sharp drops", String(f.sharp_drops ?? "—")]]
    : [["tokens", `${f.token_count ?? data.token_ids.length} ${made}, ${data.readout} read out at ${data.n_layers} layers`],
      ["DTR", `${fmt(dtr, 4)} over the read-out tokens (deep: settles at layer ≥ ${data.deep_from}; g = ${data.g})`]];
  if ("answer" in f) facts.push(["answer", `${f.answer ?? "none"} (read by ${f.answer_source ?? "?"}, ${f.grade ?? "?"}; finish ${f.finish ?? "?"})`]);
  if (f.stopped_at !== undefined && f.stopped_at !== null) facts.push(["online", `${f.phase}: stopped at token ${f.stopped_at}`]);
  else if (f.phase) facts.push(["online", `${f.phase}: ran to its end`]);
  for (const key of ["dtr_prefix", "mean_settling_depth", "log_prob", "neg_perplexity", "self_certainty", "tcb_min"]) {
    if (typeof f[key] === "number" && data.kind === "scores") facts.push([key, fmt(f[key], 4)]);
  }
  const legend = data.shade ? el("div", {class: "legend"}, data.shade_label, " · ",
    el("span", {class: "tok drop sample"}, data.mark_label)) : el("div", {class: "legend"}, "settling depth: ",
    [1, Math.ceil(data.n_layers / 2), data.n_layers].map((d) => el("span", {class: "swatch",
      style: `background:${paletteColour(RUN.palette, depthShade(d))};color:${isDark(RUN.palette, depthShade(d)) ? "#fff" : "#000"}`}, `layer ${d}`)),
    el("span", {class: "tok deep sample"}, "deep-thinking token"), el("span", {class: "tok nr sample"}, "not read out"),
    el("span", {class: "tok ws sample"}, "␣ ↵ whitespace"), el("span", {class: "tok byte sample"}, "⟨e2⟩ part of a character"));
  const tokens = el("div", {id: "tokens", class: "tokens"}, data.tokens.map((label, t) => tokenSpan(label, t)));
  tokens.addEventListener("click", (event) => {  // one listener for every token
    const span = event.target.closest(".tok[data-i]");
    if (span) selectToken(Number(span.dataset.i));
  });
  const panel = el("aside", {id: "token-panel"}, el("p", {class: "wait"}, "select a token to see its divergence at every layer (← → move)"));
  const toggle = el("button", {id: "show-heatmap", disabled: !data.readout, hidden: data.kind === "tcb"},
    "token × layer heatmap");
  const wrap = el("div", {id: "heatmap-wrap", hidden: params.get("view") !== "heatmap"});
  toggle.addEventListener("click", () => {
    wrap.hidden = !wrap.hidden;
    if (!wrap.hidden) drawHeatmap(wrap);
  });
  const p = data.prompt;  // what the model was given: open, and one click folds it away
  const prompt = p ? el("details", {id: "prompt", open: true}, el("summary", {}, p.source === "prompt"
    ? `prompt (${p.tokens} tokens, as the model read it)` : "question (the prompt's tokens could not be decoded here)"),
    el("pre", {class: "prompt"}, p.text)) : null;
  const lensToggle = el("button", {id: "show-lens", disabled: !data.readout, hidden: data.kind === "tcb",
    title: "each layer's top-1 token at every read-out token (--layer-top-k)"}, "logit lens");
  const lensWrap = el("div", {id: "lens-wrap", hidden: params.get("view") !== "lens"});
  lensToggle.addEventListener("click", () => {
    lensWrap.hidden = !lensWrap.hidden;
    if (!lensWrap.hidden) drawLens(lensWrap);
  });
  main.replaceChildren(el("section", {id: "response", "data-id": data.id}, crumbs, el("h2", {}, `${data.kind === "scores" ? "record" : "response"} ${data.id}`),
    el("dl", {class: "facts"}, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {"data-fact": k}, v)])), prompt,
    data.notes.map((n) => el("p", {class: "notice"}, n)), legend, el("div", {class: "toolbar"}, toggle, " ", lensToggle), wrap, lensWrap,
    el("div", {class: "split"}, tokens, panel)));
  if (!wrap.hidden) drawHeatmap(wrap);
  if (!lensWrap.hidden) drawLens(lensWrap);
  const start = params.get("tok");
  if (start !== null && Number(start) < data.tokens.length) selectToken(Number(start));
}

function tokenSpan(label, t) {
  const kind = RESPONSE.token_kinds[t];
  const classes = ["tok", kind === "space" ? "ws" : kind === "byte" ? "byte" : kind === "empty" ? "empty" : ""];
  let style = "";
  if (RESPONSE.shade) {  // a TCB trace: shaded by δ, sharp drops marked
    const x = RESPONSE.shade[t] ?? 0;
    style = `background:${paletteColour(RUN.palette, x)};` + (isDark(RUN.palette, x) ? "color:#fff;" : "");
    if (RESPONSE.marked[t]) classes.push("drop");
  } else if (t < RESPONSE.readout) {
    const x = depthShade(RESPONSE.settling_depth[t]);
    style = `background:${paletteColour(RUN.palette, x)};` + (isDark(RUN.palette, x) ? "color:#fff;" : "");
    if (RESPONSE.deep[t]) classes.push("deep");
  } else {
    classes.push("nr");
  }
  const title = RESPONSE.shade ? `token ${t} · δ = ${fmt(RESPONSE.per_token.tcb[t], 4)}${RESPONSE.marked[t] ? " · sharp drop" : ""}`
    : t < RESPONSE.readout
    ? `token ${t} · settles at layer ${RESPONSE.settling_depth[t]}${RESPONSE.deep[t] ? " · deep-thinking" : ""}`
    : `token ${t} · not read out`;
  const span = el("span", {class: classes.join(" ").trim(), style, "data-i": t, title}, label);
  return label.includes("↵") ? [span, el("br")] : span;
}

// Select token t; ``layer`` (1..L) also picks the layer whose top-k the panel lists (else the one picked before).
function selectToken(t, layer) {
  SELECTED = t;
  if (layer !== undefined) LAYER = layer;
  for (const node of document.querySelectorAll(".tok.selected")) node.classList.remove("selected");
  const span = document.querySelector(`.tok[data-i="${t}"]`);
  if (span) { span.classList.add("selected"); span.scrollIntoView({block: "nearest"}); }
  const panel = $("#token-panel");
  const per = RESPONSE.per_token;
  const values = Object.keys(per).map((k) => [k, fmt(per[k][t], 4)]);
  const readOut = t < RESPONSE.readout;
  const facts = [["kind", RESPONSE.token_kinds[t]]];
  if (RESPONSE.token_ids.length) facts.unshift(["token id", RESPONSE.token_ids[t]]);
  if (readOut) {
    facts.push(["settling depth", `layer ${RESPONSE.settling_depth[t]} of ${RESPONSE.n_layers}`]);
    facts.push(["deep-thinking", RESPONSE.deep[t] ? `yes (settles at layer ≥ ${RESPONSE.deep_from})` : "no"]);
  }
  panel.replaceChildren(...[el("h3", {}, `token ${t}: `, el("code", {id: "token-label"}, RESPONSE.tokens[t])),
    el("dl", {class: "facts", id: "token-facts"}, [...facts, ...values].map(([k, v]) => [el("dt", {}, k), el("dd", {"data-field": k}, String(v))])),
    readOut ? layerChart(t) : RESPONSE.shade ? null : el("p", {class: "notice"}, "this token was not read out at every layer (--readout-tokens)"),
    readOut ? layerTable(t) : null, readOut && !RESPONSE.shade ? layerTopPanel(t) : null].filter(Boolean));
  if (!$("#heatmap-wrap").hidden) drawHeatmap($("#heatmap-wrap"));
  markLensCell();
}

// One token's divergence to the final layer at every layer: the line Think@n's depth is read from.
function layerChart(t) {
  const row = divergenceRow(t), L = RESPONSE.n_layers;
  const W = 320, H = 170, left = 36, bottom = 24, top = 8, right = 8;
  const ymax = Math.max(RESPONSE.unit === "bits" ? 1 : 0, ...row.map((v) => v ?? 0), RESPONSE.g) || 1;
  const x = (layer) => left + ((layer - 1) / Math.max(1, L - 1)) * (W - left - right);
  const y = (v) => top + (1 - v / ymax) * (H - top - bottom);
  const chart = svg("svg", {id: "layer-chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H});
  chart.append(svg("rect", {x: x(RESPONSE.deep_from) - 3, y: top, width: W - right - x(RESPONSE.deep_from) + 3,
    height: H - top - bottom, class: "deep-zone"}));
  chart.append(svg("line", {x1: left, x2: W - right, y1: y(RESPONSE.g), y2: y(RESPONSE.g), class: "threshold"}));
  const depth = RESPONSE.settling_depth[t];
  chart.append(svg("line", {x1: x(depth), x2: x(depth), y1: top, y2: H - bottom, class: "settle"}));
  chart.append(svg("polyline", {points: row.map((v, i) => `${x(i + 1)},${y(v ?? 0)}`).join(" "), class: "trace"}));
  row.forEach((v, i) => chart.append(svg("circle", {cx: x(i + 1), cy: y(v ?? 0), r: 2.2, class: i + 1 === depth ? "dot settled" : "dot"})));
  for (const layer of [1, Math.ceil(L / 2), L]) {
    const label = svg("text", {x: x(layer), y: H - 8, class: "axis", "text-anchor": "middle"});
    label.textContent = layer;
    chart.append(label);
  }
  for (const v of [0, ymax]) {
    const label = svg("text", {x: left - 4, y: y(v) + 3, class: "axis", "text-anchor": "end"});
    label.textContent = v.toFixed(2);
    chart.append(label);
  }
  const caption = el("p", {class: "caption"}, `divergence to the final layer (${RESPONSE.unit}) by layer; dashed: g = ${RESPONSE.g}; ` +
    `vertical: settles at layer ${depth}; shaded: the deep regime (layer ≥ ${RESPONSE.deep_from})`);
  return el("figure", {}, chart, caption);
}

function layerTable(t) {
  const row = divergenceRow(t);
  return el("details", {}, el("summary", {}, "values"), el("table", {id: "layer-values"},
    el("tbody", {}, row.map((v, i) => el("tr", {"data-layer": i + 1}, el("td", {}, `layer ${i + 1}`), el("td", {class: "num"}, fmt(v, 5)))))));
}

// Token × layer: columns are tokens, rows layers (final on top); each token's settling layer is marked, deep
// tokens have a blue tick below; a click selects the token.
// The cells, one pixel each (token across, layer up), coloured from the palette: an ImageData filled in one loop,
// drawn scaled without smoothing — not one fillRect a cell (a long response has hundreds of thousands).
function heatmapCells(T, L) {
  if (RESPONSE.cells) return RESPONSE.cells;
  const rgb = RUN.palette.map((c) => c.match(/\d+/g).map(Number));
  const vmax = divergenceMax();
  const image = new ImageData(T, L);
  const top = rgb.length - 1;
  for (let t = 0; t < T; t++) {
    for (let l = 0; l < L; l++) {
      const v = RESPONSE.divergence[t * L + l];
      const [r, g, b] = rgb[Math.round(Math.max(0, Math.min(1, (v || 0) / vmax)) * top)];
      const at = ((L - 1 - l) * T + t) * 4;
      image.data[at] = r; image.data[at + 1] = g; image.data[at + 2] = b; image.data[at + 3] = 255;
    }
  }
  const cells = document.createElement("canvas");
  cells.width = T;
  cells.height = L;
  cells.getContext("2d").putImageData(image, 0, 0);
  RESPONSE.cells = cells;
  return cells;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}

// Every k-th of n items, k from 1, 2, 5, 10, 20, 50, … so that ticks stand at least `gap` pixels apart.
function tickStep(size, gap) {
  for (let k = 1; ; k *= 10) {
    for (const m of [1, 2, 5]) if (k * m * size >= gap) return k * m;
  }
}

// The layer axis left of the heatmap: a tick and number per layer (every k-th when rows are thin), final on top.
function layerAxis(L, ch) {
  const width = 46, axis = svg("svg", {id: "heatmap-y", width, height: L * ch + 6, class: "axis"});
  const step = tickStep(ch, 14);
  for (let l = 1; l <= L; l++) {
    if (l % step && l !== 1 && l !== L) continue;
    const y = (L - l) * ch + ch / 2;
    axis.append(svg("line", {x1: width - 5, x2: width, y1: y, y2: y}));
    axis.append(svg("text", {x: width - 7, y: y + 4, "text-anchor": "end", "data-layer": l}, String(l)));
  }
  axis.append(svg("text", {x: 10, y: (L * ch) / 2, transform: `rotate(-90 10 ${(L * ch) / 2})`, "text-anchor": "middle"}, "layer"));
  return axis;
}

// The token axis below the heatmap: token positions (as the token panel numbers them) every k-th column.
function tokenAxis(T, cw) {
  const axis = svg("svg", {id: "heatmap-x", width: T * cw, height: 34, class: "axis"});
  for (let t = 0; t < T; t += tickStep(cw, 40)) {
    const x = t * cw + cw / 2;
    axis.append(svg("line", {x1: x, x2: x, y1: 0, y2: 5}));
    axis.append(svg("text", {x, y: 16, "text-anchor": "middle", "data-token": t}, String(t)));
  }
  axis.append(svg("text", {x: (T * cw) / 2, y: 31, "text-anchor": "middle"}, "token"));
  return axis;
}

// Token × layer: columns are tokens, rows layers (final on top); each token's settling layer is marked, deep
// tokens have a blue tick below; a click selects the token.
function drawHeatmap(wrap) {
  const T = RESPONSE.readout, L = RESPONSE.n_layers;
  const cw = Math.max(1, Math.min(16, Math.floor(1200 / Math.max(1, T))));
  const ch = Math.max(4, Math.min(12, Math.floor(360 / L)));
  let canvas = wrap.querySelector("canvas");
  if (!canvas) {
    canvas = el("canvas", {id: "heatmap"});
    canvas.addEventListener("click", (event) => {
      const rect = canvas.getBoundingClientRect();
      const t = Math.floor((event.clientX - rect.left) / cw);
      const l = L - Math.floor((event.clientY - rect.top) / ch);  // rows: the final layer on top
      if (t >= 0 && t < T) selectToken(t, l >= 1 && l <= L ? l : undefined);
    });
    // the axes sit beside the canvas (not on it), so a click's x on the canvas is still its token
    const grid = el("div", {id: "heatmap-grid"}, layerAxis(L, ch), canvas, el("span"), tokenAxis(T, cw));
    wrap.replaceChildren(grid, colourScale("heatmap-scale", RUN.palette, divergenceMax(),
      `divergence to the final layer (${RESPONSE.unit})`), el("p", {class: "caption"}, `rows: layers 1 (bottom) to ${L} (top); columns: the ${T} read-out tokens; colour: divergence to the final layer (${RESPONSE.unit}); ringed: where each token settles; blue tick: a deep-thinking token; click a cell for that layer's top-k tokens`));
  }
  canvas.width = T * cw;
  canvas.height = L * ch + 6;
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(heatmapCells(T, L), 0, 0, T * cw, L * ch);
  ctx.fillStyle = "#1f77b4";
  for (let t = 0; t < T; t++) {
    if (cw >= 4) {
      ctx.strokeStyle = RESPONSE.deep[t] ? "#1f77b4" : "#2ca02c";
      ctx.strokeRect(t * cw + 0.5, (L - RESPONSE.settling_depth[t]) * ch + 0.5, cw - 1, ch - 1);
    }
    if (RESPONSE.deep[t]) ctx.fillRect(t * cw, L * ch + 2, cw, 4);
  }
  if (SELECTED !== null && SELECTED < T) {
    ctx.strokeStyle = "#00bcd4";
    ctx.lineWidth = 2;
    ctx.strokeRect(SELECTED * cw, 0, cw, L * ch);
    if (LAYER !== null) {
      ctx.strokeStyle = "#e8590c";
      ctx.strokeRect(SELECTED * cw, (L - LAYER) * ch, cw, ch);
    }
    ctx.lineWidth = 1;
  }
}

document.addEventListener("keydown", (event) => {
  if (!RESPONSE || SELECTED === null || !$("#tokens")) return;
  if (event.target.tagName === "INPUT" || event.target.tagName === "SELECT") return;
  if (event.key === "ArrowRight" && SELECTED + 1 < RESPONSE.tokens.length) selectToken(SELECTED + 1);
  if (event.key === "ArrowLeft" && SELECTED > 0) selectToken(SELECTED - 1);
  const layer = LAYER ?? RESPONSE.n_layers;  // ↑ ↓: the layer whose top-k the panel lists
  if (event.key === "ArrowUp" && layer < RESPONSE.n_layers) { event.preventDefault(); selectToken(SELECTED, layer + 1); }
  if (event.key === "ArrowDown" && layer > 1) { event.preventDefault(); selectToken(SELECTED, layer - 1); }
});

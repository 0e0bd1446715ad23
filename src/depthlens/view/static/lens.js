// depthlens view: each layer's own predictions (--layer-top-k K) — a heatmap cell's top-k list in the token panel,
// and the logit lens: read-out tokens × layers, each cell the layer's top-1 token (the classic logit-lens picture).
// The ids and probabilities come as [R × L × K] arrays (RESPONSE.layer_top), labelled by the store's tokenizer.
"use strict";

let LAYER = null;  // the selected layer (1..L) of the selected token; null: none picked (the final layer is listed)

function layerTop() {
  const top = RESPONSE.layer_top;
  if (top && !top.decoded) {
    top.ids = decodeInts(top.ids);
    top.probs = decodeFloats(top.probs);
    top.decoded = true;
  }
  return top;
}

// Token t's K most probable tokens at layer l (1..L), most probable first: [{id, text, p}].
function topAt(t, l) {
  const top = layerTop(), L = RESPONSE.n_layers, K = top.k;
  const at = (t * L + (l - 1)) * K;
  return Array.from({length: K}, (_, k) => {
    const id = top.ids[at + k];
    return {id, text: top.texts[String(id)] ?? `#${id}`, p: top.probs[at + k]};
  });
}

// The read-out token's own trajectory (--layer-target): {p, rank} of token t at layer l (1..L), or null: none kept.
function targetAt(t, l) {
  const target = RESPONSE.layer_target;
  if (!target) return null;
  if (!target.decoded) {
    target.logprobs = decodeFloats(target.logprobs);
    target.ranks = decodeInts(target.ranks);
    target.decoded = true;
  }
  const at = t * RESPONSE.n_layers + (l - 1);
  return {p: Math.exp(target.logprobs[at]), rank: target.ranks[at]};
}

// The line under a cell's list: the token read out at t, its probability and rank at layer l (0 = most probable).
function targetLine(t, l) {
  const row = targetAt(t, l);
  if (!row) return null;
  const said = `the read-out token at layer ${l}: p = ${fmt(row.p, 4)}, rank ${row.rank}` +
    (row.rank === 0 ? " (the most probable)" : ` (${row.rank} token${row.rank === 1 ? "" : "s"} more probable)`);
  return el("p", {id: "layer-target", "data-layer": l, "data-rank": row.rank, "data-p": row.p}, said);
}

// How to get the layer predictions, where a record has none: a notice in the logit lens, a caption in the panel.
function missingNote(id, kind = "notice") {
  return el("p", {class: kind, id}, RESPONSE.layer_top_missing);
}

// The token panel's list: what layer l (default: the final one) predicts at token t, with probabilities.
function layerTopPanel(t) {
  const L = RESPONSE.n_layers, l = LAYER ?? L;
  if (!layerTop()) {
    const target = targetLine(t, l);
    const missing = missingNote("layer-top-missing", "caption");
    return target ? el("section", {id: "layer-top-box"}, el("h4", {id: "layer-top-title", "data-layer": l},
      `layer ${l} of ${L}${l === L ? " (the model's own)" : ""}`), target, missing) : missing;
  }
  const actual = RESPONSE.token_ids[t];
  const rows = topAt(t, l).map((row, k) => el("tr", {"data-rank": k + 1, class: row.id === actual ? "hit" : null},
    el("td", {class: "num"}, k + 1), el("td", {}, el("code", {}, row.text)), el("td", {class: "num"}, fmt(row.p, 4))));
  const title = `layer ${l} of ${L}${l === L ? " (the model's own)" : ""}: its top ${layerTop().k}`;
  return el("section", {id: "layer-top-box"}, el("h4", {id: "layer-top-title", "data-layer": l}, title),
    el("table", {id: "layer-top"}, el("thead", {}, el("tr", {}, el("th", {class: "num"}, "#"), el("th", {}, "token"),
      el("th", {class: "num"}, "p"))), el("tbody", {}, rows)), targetLine(t, l),
    el("p", {class: "caption"}, LAYER === null ? "click a heatmap or logit-lens cell for another layer (↑ ↓ move)"
      : "bold: the token that was read out here; ↑ ↓ move the layer"));
}

// The logit lens: one row per layer (final on top), one column per read-out token (its label above), each cell
// the layer's top-1 token, coloured by its probability or by the layer's divergence to the final one.
function drawLens(wrap) {
  if (!layerTop()) {
    wrap.replaceChildren(missingNote("lens-missing"));
    return;
  }
  const T = RESPONSE.readout, L = RESPONSE.n_layers, K = layerTop().k;
  const colour = $("#lens-colour") ? $("#lens-colour").value : "probability";
  const vmax = colour === "divergence" ? divergenceMax() : 1;
  const {ids, probs, texts} = layerTop();
  const head = el("tr", {}, el("th", {class: "corner", title: "layer ╲ token"}, "layer"),
    Array.from({length: T}, (_, t) => el("th", {"data-t": t, title: `token ${t}`}, RESPONSE.tokens[t])));
  const body = [];
  for (let l = L; l >= 1; l--) {
    const cells = [el("th", {class: "layer"}, l)];
    for (let t = 0; t < T; t++) {
      const at = (t * L + (l - 1)) * K, id = ids[at], p = probs[at];
      const x = colour === "divergence" ? Math.max(0, Math.min(1, (RESPONSE.divergence[t * L + l - 1] || 0) / vmax)) : p;
      cells.push(el("td", {"data-t": t, "data-layer": l, class: id === RESPONSE.token_ids[t] ? "hit" : null,
        style: `background:${paletteColour(RUN.palette, x)};${isDark(RUN.palette, x) ? "color:#fff;" : ""}`,
        title: `token ${t} · layer ${l} · p = ${fmt(p, 4)}`}, texts[String(id)] ?? `#${id}`));
    }
    body.push(el("tr", {"data-layer": l}, cells));
  }
  const table = el("table", {id: "logit-lens"}, el("thead", {}, head), el("tbody", {}, body));
  table.addEventListener("click", (event) => {  // one listener for every cell
    const cell = event.target.closest("td[data-t]");
    if (cell) selectToken(Number(cell.dataset.t), Number(cell.dataset.layer));
  });
  const select = el("select", {id: "lens-colour"}, ["probability", "divergence"].map((v) =>
    el("option", {value: v, selected: v === colour}, v)));
  select.addEventListener("change", () => drawLens(wrap));
  const what = colour === "divergence" ? `the layer's divergence to the final one (${RESPONSE.unit})`
    : "the top-1 token's probability";
  const scale = colourScale("lens-scale", RUN.palette, vmax, colour === "divergence"
    ? `divergence to the final layer (${RESPONSE.unit})` : "top-1 probability");
  wrap.replaceChildren(el("div", {class: "controls"}, el("label", {}, "colour by ", select), scale),
    el("div", {class: "lens-scroll"}, table),
    el("p", {class: "caption"}, `logit lens: each cell is what layer l predicts at token t (its top-1 of ${K}); ` +
      `columns: the ${T} read-out tokens (the token read out above); colour: ${what}; bold: the read-out token ` +
      "itself; click a cell for its top-k"));
  markLensCell();
}

// Ring the selected token × layer in the logit lens (a class on one cell: the grid is not drawn again).
function markLensCell() {
  for (const cell of document.querySelectorAll("#logit-lens td.picked")) cell.classList.remove("picked");
  const l = LAYER ?? RESPONSE.n_layers;
  const cell = SELECTED === null ? null : document.querySelector(`#logit-lens td[data-t="${SELECTED}"][data-layer="${l}"]`);
  if (cell) cell.classList.add("picked");
}

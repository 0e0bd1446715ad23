// depthlens view: small helpers shared by the views (no framework, no build step).
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);

// el("td", {class: "x", "data-i": 3}, "text", child) → an element
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "onclick") node.addEventListener("click", value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const svgNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}) {
  const node = document.createElementNS(svgNS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

function fmt(value, digits = 3) {
  return value === null || value === undefined || Number.isNaN(value) ? "—" : Number(value).toFixed(digits);
}

function pct(value, digits = 0) {
  return value === null || value === undefined ? "—" : (100 * value).toFixed(digits) + "%";
}

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// Little-endian float32 values sent as base64 (a response's [T × L] divergences) → a Float32Array.
function decodeFloats(base64) {
  const text = atob(base64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);  // a plain loop: ~5x Uint8Array.from(…, fn)
  return new Float32Array(bytes.buffer);
}

// Little-endian int32 values sent as base64 (each layer's top-k token ids) → an Int32Array.
function decodeInts(base64) {
  return new Int32Array(decodeFloats(base64).buffer);
}

// The colour of a value in [0, 1] from the heatmap's palette (light: settled early, dark: late).
function paletteColour(palette, x) {
  const i = Math.max(0, Math.min(palette.length - 1, Math.round(x * (palette.length - 1))));
  return palette[i];
}

function isDark(palette, x) {
  return x > 0.45;
}

// The key to a grid's colours: one swatch per palette colour, left (0) to right (`hi`) — the very colours the cells
// take — numbered at its ends and middle, with what the colour means.
function colourScale(id, palette, hi, label) {
  const top = palette.length - 1;
  const digits = hi >= 10 ? 0 : hi >= 1 ? 1 : 2;
  const swatches = palette.map((c, i) => el("span", {style: `background:${c}`, "data-x": (i / top).toFixed(4),
    title: fmt((i / top) * hi, digits + 2)}));
  const ticks = [0, 0.5, 1].map((f) => el("span", {class: "tick", style: `left:${100 * f}%`, "data-value": f * hi},
    f === 0 ? "0" : fmt(f * hi, f === 1 && hi === 1 ? 0 : digits)));
  return el("div", {class: "colour-scale", id}, el("span", {class: "scale-label"}, label),
    el("span", {class: "scale-bar"}, el("span", {class: "ramp"}, swatches), el("span", {class: "ticks"}, ticks)));
}

// The largest divergence of the response (the colour scale's top where the unit has no bound: nats, 1 − cos).
function divergenceMax() {
  if (RESPONSE.unit === "bits") return 1;
  let vmax = 0;  // a loop, not Math.max(...): a long response has more values than arguments fit
  for (const v of RESPONSE.divergence) if (v > vmax) vmax = v;
  return vmax || 1;
}

// ✓ / ✗ / a share, for a method's accuracy over the trials on one question.
function mark(accuracy) {
  if (accuracy === null || accuracy === undefined) return el("span", {class: "pending"}, "…");
  if (accuracy === 1) return el("span", {class: "right", title: "right in every draw"}, "✓");
  if (accuracy === 0) return el("span", {class: "wrong", title: "wrong in every draw"}, "✗");
  return el("span", {class: "mixed", title: "right in this share of the draws"}, accuracy.toFixed(2));
}

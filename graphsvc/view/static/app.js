// graphsvc view: the page. It asks the server only for what is shown (/api/view with the open
// groups), lays that out with elkjs (layered, open groups as containers) and draws it as SVG.
// Every name and number goes into the DOM as text (textContent / createElementNS), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CHAR = 7.3; // width of one 12px monospace character, for sizing boxes before they are drawn
const LINE = 16;
const HEADER = 24; // height of an open group's header

const state = {
  meta: null,
  open: [0], // group ids open (the root always)
  view: null, // the last /api/view answer
  byKey: new Map(), // item key -> item
  boxes: new Map(), // item key -> {x, y, width, height} in graph coordinates
  overlay: "none",
  selected: null, // node id shown in the detail panel
  highlight: null, // item key highlighted after a search
  zoom: { x: 0, y: 0, k: 1 },
  lastLayoutMs: 0,
};

const $ = (id) => document.getElementById(id);

// -- helpers --------------------------------------------------------------------------------------
function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = String(text);
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = String(text);
  return node;
}

function clip(text, max) {
  text = String(text);
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

function showMessage(text) {
  const box = $("message");
  box.textContent = text || "";
  box.hidden = !text;
}

// A number from the API: a float, or "nan" / "inf" / "-inf" as text.
function num(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === "number") return value;
  return value === "nan" ? NaN : value === "-inf" ? -Infinity : Infinity;
}

function short(value) {
  const x = num(value);
  if (x === null) return "–";
  if (!Number.isFinite(x)) return String(value);
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : String(Number(x.toPrecision(4)));
}

function shapeText(item) {
  return item.shape && item.shape.length ? `${item.dtype}[${item.shape.join(", ")}]` : item.dtype;
}

function topOps(ops, n) {
  return Object.entries(ops || {}).slice(0, n).map(([op, count]) => `${op}×${count}`).join(" ");
}

// -- the lines each item shows (sizes its box) ----------------------------------------------------
function linesOf(item) {
  if (item.kind === "node") {
    const lines = [clip(item.label, 48), `${item.op} ${shapeText(item)}`];
    lines.push(clip(`value ${item.value}`, 48));
    if (item.grad !== null && item.grad !== undefined) lines.push(clip(`grad ${item.grad}`, 48));
    return lines;
  }
  const lines = [clip(item.label, 48), `${item.nodes.toLocaleString("en")} nodes · ${item.items} items`];
  const ops = topOps(item.ops, 3);
  if (ops) lines.push(clip(ops, 48));
  if (item.max_abs_grad !== null && item.max_abs_grad !== undefined) lines.push(`max|grad| ${short(item.max_abs_grad)}`);
  return lines;
}

function sizeOf(item) {
  const lines = linesOf(item);
  const width = Math.max(...lines.map((line) => line.length)) * CHAR + 20 + (item.nonfinite ? 40 : 0);
  return { width: Math.max(90, Math.ceil(width)), height: lines.length * LINE + 10, lines };
}

// -- layout ---------------------------------------------------------------------------------------
const elk = new ELK();

// The ELK graph of the current view: items nested under their open groups, edges at the root.
function elkGraph(view) {
  const nodes = new Map();
  const root = {
    id: "root",
    layoutOptions: {
      "elk.algorithm": "layered",
      "elk.direction": "DOWN",
      "elk.hierarchyHandling": "INCLUDE_CHILDREN",
      "elk.edgeRouting": "ORTHOGONAL",
      "elk.layered.spacing.nodeNodeBetweenLayers": "28",
      "elk.spacing.nodeNode": "18",
      "elk.json.shapeCoords": "ROOT",
      "elk.json.edgeCoords": "ROOT",
    },
    children: [],
    edges: [],
  };
  for (const item of view.items) {
    const node = { id: item.key, children: [] };
    if (item.kind === "group" && item.open) {
      node.layoutOptions = { "elk.padding": `[top=${HEADER + 10},left=10,bottom=10,right=10]` };
      // an open group with no member drawn still needs room for its header
      node.width = Math.max(120, (clip(item.label, 48).length + 16) * CHAR);
      node.height = HEADER + 20;
    } else {
      const size = sizeOf(item);
      node.width = size.width;
      node.height = size.height;
    }
    nodes.set(item.key, node);
    const parent = item.parent === null ? root : nodes.get(item.parent);
    (parent || root).children.push(node);
  }
  view.edges.forEach((edge, i) => {
    root.edges.push({ id: `e${i}`, sources: [edge.source], targets: [edge.target], count: edge.count });
  });
  return root;
}

async function layout(view) {
  const started = performance.now();
  const placed = await elk.layout(elkGraph(view));
  state.lastLayoutMs = performance.now() - started;
  return placed;
}

// -- drawing --------------------------------------------------------------------------------------
function draw(view, placed) {
  const port = $("viewport");
  port.replaceChildren();
  state.boxes.clear();
  state.byKey = new Map(view.items.map((item) => [item.key, item]));
  const edgeLayer = svg("g", { class: "edges" });
  const itemLayer = svg("g", { class: "items" });
  // parents come before children in ELK's output as in ours: walk without recursion
  const stack = [...(placed.children || [])].reverse();
  while (stack.length) {
    const node = stack.pop();
    const item = state.byKey.get(node.id);
    const box = { x: node.x, y: node.y, width: node.width, height: node.height };
    state.boxes.set(node.id, box);
    itemLayer.append(drawItem(item, box));
    for (const child of [...(node.children || [])].reverse()) stack.push(child);
  }
  for (const edge of placed.edges || []) {
    for (const section of edge.sections || []) {
      const points = [section.startPoint, ...(section.bendPoints || []), section.endPoint];
      const d = points.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      edgeLayer.append(svg("path", { d, class: edge.count > 1 ? "edge many" : "edge", "marker-end": "url(#arrow)" }));
    }
  }
  port.append(edgeLayer, itemLayer);
  colour();
}

function drawItem(item, box) {
  const g = svg("g", {
    class: `item ${item.kind}`,
    transform: `translate(${box.x},${box.y})`,
    "data-key": item.key,
    "data-parent": item.parent || "",
  });
  if (item.kind === "group" && item.open) {
    g.classList.add("open");
    g.append(svg("rect", { width: box.width, height: box.height, rx: 6 }));
    const header = svg("g", { class: "header", tabindex: 0, role: "button", "aria-label": `close group ${item.label}` });
    header.append(svg("rect", { width: box.width, height: HEADER, rx: 6 }));
    header.append(svg("text", { x: 8, y: 16 }, `▾ ${clip(item.label, 48)}`));
    header.append(svg("text", { x: 8 + (clip(item.label, 48).length + 3) * CHAR, y: 16, class: "small" }, `${item.nodes.toLocaleString("en")} nodes`));
    header.addEventListener("click", () => closeGroup(item.id));
    header.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); closeGroup(item.id); }
    });
    g.append(header);
    return g;
  }
  const { lines } = sizeOf(item);
  g.append(svg("rect", { width: box.width, height: box.height, rx: item.kind === "group" ? 8 : 3 }));
  lines.forEach((line, i) => {
    g.append(svg("text", { x: 10, y: 17 + i * LINE, class: i ? "small" : "" }, line));
  });
  if (item.nonfinite) {
    const text = item.kind === "group" ? `nan ${item.nonfinite}` : "nan";
    g.append(svg("rect", { class: "badge", x: box.width - 40, y: 5, width: 34, height: 14, rx: 7 }));
    g.append(svg("text", { class: "badge-text", x: box.width - 23, y: 15, "text-anchor": "middle" }, clip(text, 6)));
  }
  g.setAttribute("tabindex", "0");
  if (item.kind === "group") {
    g.classList.add("closed");
    g.setAttribute("role", "button");
    g.setAttribute("aria-label", `open group ${item.label}, ${item.nodes} nodes`);
    g.addEventListener("click", () => openGroups([item.id]));
    g.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); openGroups([item.id]); }
    });
  } else {
    g.setAttribute("role", "button");
    g.setAttribute("aria-label", `node ${item.label}, ${item.op}`);
    g.addEventListener("click", () => showNode(item.id));
    g.addEventListener("keydown", (event) => { if (event.key === "Enter") showNode(item.id); });
  }
  if (item.key === state.highlight) g.classList.add("highlight");
  if (item.kind === "node" && item.id === state.selected) g.classList.add("selected");
  return g;
}

// -- overlays: a fill colour per item, and a legend ------------------------------------------------
function ramp(t) {
  // white -> blue -> dark red, t in [0, 1]
  t = Math.min(1, Math.max(0, t));
  const stops = [[255, 255, 255], [116, 169, 207], [5, 112, 176], [165, 15, 21]];
  const at = t * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(at));
  const f = at - i;
  const c = stops[i].map((v, j) => Math.round(v + (stops[i + 1][j] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

const CATEGORY = {
  nonfinite: { value: "#ffa8a8", grad: "#ffd8a8", both: "#e03131", group: "#ff8787", none: "#ffffff" },
  diff: { values: "#ffd43b", grads: "#74c0fc", both: "#f76707", structure: "#cc5de8", unaligned: "#adb5bd", group: "#ffa94d", none: "#ffffff" },
};

// The quantity an overlay colours by, for one item (null: no colour).
function measure(item, overlay) {
  if (overlay === "value") return num(item.max_abs_value);
  if (overlay === "grad") return num(item.max_abs_grad);
  if (overlay === "step") return item.kind === "node" ? item.step : item.steps ? item.steps[0] : null;
  return null;
}

function colour() {
  const overlay = state.overlay;
  const legend = $("legend");
  legend.replaceChildren();
  const items = state.view ? state.view.items.filter((item) => !(item.kind === "group" && item.open)) : [];
  let fill = () => null;
  if (overlay === "value" || overlay === "grad" || overlay === "step") {
    const values = items.map((item) => measure(item, overlay)).filter((x) => x !== null && !Number.isNaN(x));
    const finite = values.filter(Number.isFinite);
    const log = overlay !== "step"; // magnitudes span decades; steps are positions
    const f = (x) => (log ? Math.log10(Math.abs(x) + 1e-30) : x);
    const lo = finite.length ? Math.min(...finite.map(f)) : 0;
    const hi = finite.length ? Math.max(...finite.map(f)) : 1;
    fill = (item) => {
      const x = measure(item, overlay);
      if (x === null) return null;
      if (!Number.isFinite(x)) return "#e03131";
      return ramp(hi > lo ? (f(x) - lo) / (hi - lo) : 0.5);
    };
    const name = { value: "max |value|", grad: "max |grad|", step: "backward step" }[overlay];
    const lowText = finite.length ? short(log ? Math.min(...finite.map(Math.abs)) : lo) : "–";
    const highText = finite.length ? short(log ? Math.max(...finite.map(Math.abs)) : hi) : "–";
    legend.append(el("span", {}, name), swatch(ramp(0)), el("span", {}, lowText), swatch(ramp(0.5)),
      swatch(ramp(1)), el("span", {}, highText), swatch("#e03131"), el("span", {}, "nan/inf"));
  } else if (overlay === "nonfinite" || overlay === "diff") {
    const palette = CATEGORY[overlay];
    fill = (item) => {
      if (item.kind === "group") {
        const count = overlay === "nonfinite" ? item.nonfinite : item.diff;
        return count ? palette.group : palette.none;
      }
      const what = overlay === "nonfinite" ? item.nonfinite : item.diff;
      return what ? palette[what] : palette.none;
    };
    legend.append(el("span", {}, overlay === "nonfinite" ? "nan/inf in" : "differs in"));
    for (const [key, value] of Object.entries(palette)) {
      if (key !== "none") legend.append(swatch(value), el("span", {}, key === "group" ? "group holding some" : key));
    }
  }
  for (const node of $("viewport").querySelectorAll(".item")) {
    const item = state.byKey.get(node.dataset.key);
    const rect = node.firstChild;
    const colourOf = item && !(item.kind === "group" && item.open) ? fill(item) : null;
    if (colourOf) rect.style.fill = colourOf;
    else rect.style.removeProperty("fill");
    node.classList.toggle("dark", Boolean(colourOf) && dark(colourOf));  // white text on a dark fill
  }
}

// Whether a fill ("rgb(r,g,b)" or "#rrggbb") is dark enough that dark text on it is hard to read.
function dark(colourOf) {
  const rgb = colourOf.startsWith("#")
    ? [1, 3, 5].map((i) => parseInt(colourOf.slice(i, i + 2), 16))
    : colourOf.match(/\d+/g).map(Number);
  const [r, g, b] = rgb.map((v) => v / 255);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45;
}

function swatch(colourOf) {
  const span = el("span", { class: "swatch" });
  span.style.background = colourOf;
  return span;
}

// -- pan and zoom ---------------------------------------------------------------------------------
function applyZoom() {
  const { x, y, k } = state.zoom;
  $("viewport").setAttribute("transform", `translate(${x},${y}) scale(${k})`);
}

function graphSize() {
  let width = 0;
  let height = 0;
  for (const box of state.boxes.values()) {
    width = Math.max(width, box.x + box.width);
    height = Math.max(height, box.y + box.height);
  }
  return { width, height };
}

function fit() {
  const { width, height } = graphSize();
  const area = $("graph").getBoundingClientRect();
  if (!width || !height) return;
  const k = Math.min(2, (area.width - 40) / width, (area.height - 40) / height);
  state.zoom = { k, x: (area.width - width * k) / 2, y: Math.max(20, (area.height - height * k) / 2) };
  applyZoom();
}

function centreOn(key) {
  const box = state.boxes.get(key);
  if (!box) return;
  const area = $("graph").getBoundingClientRect();
  const k = Math.max(state.zoom.k, 0.8);
  state.zoom = { k, x: area.width / 2 - (box.x + box.width / 2) * k, y: area.height / 2 - (box.y + box.height / 2) * k };
  applyZoom();
}

function setUpPanZoom() {
  const area = $("graph");
  let drag = null;
  area.addEventListener("pointerdown", (event) => {
    if (event.target.closest(".item")) return; // items take clicks; drag the background to pan
    drag = { x: event.clientX, y: event.clientY, zx: state.zoom.x, zy: state.zoom.y };
    area.setPointerCapture(event.pointerId);
    area.classList.add("panning");
  });
  area.addEventListener("pointermove", (event) => {
    if (!drag) return;
    state.zoom.x = drag.zx + event.clientX - drag.x;
    state.zoom.y = drag.zy + event.clientY - drag.y;
    applyZoom();
  });
  const stop = () => { drag = null; area.classList.remove("panning"); };
  area.addEventListener("pointerup", stop);
  area.addEventListener("pointercancel", stop);
  area.addEventListener("wheel", (event) => {
    event.preventDefault();
    const rect = area.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const py = event.clientY - rect.top;
    const factor = Math.exp(-event.deltaY * 0.0015);
    const k = Math.min(8, Math.max(0.02, state.zoom.k * factor));
    // keep the point under the cursor where it is
    state.zoom.x = px - ((px - state.zoom.x) * k) / state.zoom.k;
    state.zoom.y = py - ((py - state.zoom.y) * k) / state.zoom.k;
    state.zoom.k = k;
    applyZoom();
  }, { passive: false });
}

// -- the view: open groups, fetch, lay out, draw --------------------------------------------------
let pending = Promise.resolve();

// Show the view with these groups open; on an error (too many items) keep the current one.
function showView(open, { refit = false } = {}) {
  pending = pending.then(async () => {
    let view;
    try {
      view = await api(`/api/view?open=${open.join(",")}`);
    } catch (error) {
      showMessage(error.message);
      return false;
    }
    showMessage("");
    const placed = await layout(view);
    state.view = view;
    state.open = view.open;
    draw(view, placed);
    if (refit) fit();
    status();
    return true;
  });
  return pending;
}

function status() {
  const nodes = state.meta ? state.meta.nodes.toLocaleString("en") : "?";
  const shown = state.view ? state.view.items.length : 0;
  $("status").textContent = `${nodes} nodes · ${shown} items shown · layout ${Math.round(state.lastLayoutMs)} ms`;
}

function openGroups(ids) {
  const open = [...new Set([...state.open, ...ids])];
  return showView(open);
}

function closeGroup(id) {
  // its open descendants close with it: the server ignores a group whose parent is not open
  return showView(state.open.filter((g) => g !== id));
}

// Open the groups holding a node, then centre on it, highlight it and show its details.
async function reveal(match) {
  const shown = await openGroups(match.groups);
  const key = `n${match.id}`;
  if (!shown || !state.boxes.has(key)) return;
  state.highlight = key;
  for (const node of $("viewport").querySelectorAll(".highlight")) node.classList.remove("highlight");
  const node = $("viewport").querySelector(`[data-key="${key}"]`);
  if (node) node.classList.add("highlight");
  centreOn(key);
  await showNode(match.id);
}

// -- the detail panel -----------------------------------------------------------------------------
function row(list, name, value) {
  list.append(el("dt", {}, name));
  const dd = el("dd");
  if (value instanceof Node) dd.append(value);
  else dd.textContent = value === null || value === undefined ? "–" : String(value);
  list.append(dd);
}

function summary(s) {
  if (!s) return "–";
  const parts = [s.text];
  if (s.min !== undefined) parts.push(`min ${short(s.min)} max ${short(s.max)} mean ${short(s.mean)}`);
  if (s.nan || s.inf) parts.push(`nan ${s.nan} inf ${s.inf}`);
  return parts.join("\n");
}

function nodeLinks(list) {
  const box = el("span");
  list.forEach((other, i) => {
    const link = el("button", { class: "link", type: "button" }, `${other.label} (${other.op})`);
    link.addEventListener("click", () => revealId(other.id));
    if (i) box.append(", ");
    box.append(link);
  });
  if (!list.length) box.textContent = "none";
  return box;
}

async function revealId(id) {
  const found = await api(`/api/search?q=${encodeURIComponent("#" + id)}&limit=1`);
  if (found.matches.length) await reveal(found.matches[0]);
}

async function showNode(id) {
  let node;
  try {
    node = await api(`/api/node?id=${id}`);
  } catch (error) {
    showMessage(error.message);
    return;
  }
  state.selected = id;
  for (const other of $("viewport").querySelectorAll(".selected")) other.classList.remove("selected");
  const drawn = $("viewport").querySelector(`[data-key="n${id}"]`);
  if (drawn) drawn.classList.add("selected");
  const panel = $("detail");
  panel.replaceChildren(el("h2", {}, node.label));
  const list = el("dl");
  row(list, "id", node.id);
  row(list, "name", node.name);
  row(list, "op", node.op);
  row(list, "plugin", node.plugin);
  row(list, "dtype", node.dtype);
  row(list, "shape", `[${(node.shape || []).join(", ")}]`);
  for (const [key, value] of Object.entries(node.attrs || {})) row(list, `attr ${key}`, value);
  row(list, "value", summary(node.value));
  row(list, "grad", summary(node.grad));
  row(list, "step", node.step);
  row(list, "nan/inf", node.nonfinite);
  row(list, "parents", nodeLinks(node.parents || []));
  const children = nodeLinks(node.children || []);
  if (node.more_children) children.append(` and ${node.more_children} more`);
  row(list, "children", children);
  if (node.diff) row(list, "diff", diffText(node.diff));
  panel.append(list);
}

// What the details say of a node's differences with FILE2: "grads (B's node 0); grad: float32[2, 3]
// max|a-b|=0.612168 at [0, 0]" (an array's summary once: it is the same for A and B), "op: A mul, B add".
function diffText(diff) {
  if (typeof diff === "string") return diff;
  const parts = (diff.differences || []).map((d) => (d.a === d.b ? `${d.kind}: ${d.a}` : `${d.kind}: A ${d.a}, B ${d.b}`));
  const where = diff.node_b == null ? "only in A" : `B's node ${diff.node_b}`;
  return [`${diff.status || "same"} (${where})`, ...parts].join("; ");
}

// -- search ---------------------------------------------------------------------------------------
let searchTimer = null;

function setUpSearch() {
  const input = $("search");
  input.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => search(input.value), 150);
  });
  input.addEventListener("keydown", async (event) => {
    if (event.key !== "Enter") return;
    clearTimeout(searchTimer);
    const found = await search(input.value);
    if (found && found.length) await reveal(found[0]);
  });
}

async function search(text) {
  const results = $("results");
  if (!text.trim()) { results.replaceChildren(); return []; }
  let found;
  try {
    found = await api(`/api/search?q=${encodeURIComponent(text)}&limit=50`);
  } catch (error) {
    showMessage(error.message);
    return [];
  }
  results.replaceChildren();
  for (const match of found.matches) {
    const item = el("li");
    const button = el("button", { type: "button" }, `${match.label} (${match.op})`);
    button.addEventListener("click", () => reveal(match));
    item.append(button);
    results.append(item);
  }
  if (!found.matches.length) results.append(el("li", { class: "hint" }, "no match"));
  if (found.more) results.append(el("li", { class: "hint" }, "more matches: type more of the name"));
  return found.matches;
}

// -- start ----------------------------------------------------------------------------------------
async function start() {
  // the arrow head every edge ends with
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#8d96a3" }));
  defs.append(marker);
  $("graph").prepend(defs);
  setUpPanZoom();
  setUpSearch();
  $("fit").addEventListener("click", fit);
  $("collapse").addEventListener("click", () => showView([0], { refit: true }));
  $("overlay").addEventListener("change", (event) => { state.overlay = event.target.value; colour(); });
  try {
    state.meta = await api("/api/graph");
  } catch (error) {
    showMessage(error.message);
    document.body.dataset.ready = "1";
    return;
  }
  document.title = `graphsvc view: ${state.meta.files.join(" and ")}`;
  $("title").textContent = `graphsvc view: ${state.meta.files.join(" and ")}`;
  const names = { value: "value", grad: "|grad|", nonfinite: "nan/inf", step: "backward step", diff: "diff" };
  for (const overlay of state.meta.overlays) $("overlay").append(el("option", { value: overlay }, names[overlay] || overlay));
  await showView([0], { refit: true });
  // a graph that sits under one scope (all of it in `model`) opens to what that scope holds
  for (let depth = 0; depth < 8; depth++) {
    const items = state.view ? state.view.items : [];
    if (items.length !== 1 || items[0].kind !== "group" || items[0].open) break;
    if (!(await showView([...state.open, items[0].id], { refit: true }))) break;
  }
  document.body.dataset.ready = "1"; // the browser test waits for this
}

start();

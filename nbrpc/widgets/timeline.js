// Front end of nbrpc's RPC timeline (an anywidget ES module, no bundler).
//
// Python draws the SVG (trait `svg`), the hover details (`details`, keyed by each
// bar's data-id) and the summary table (`table`). This module swaps the SVG in on
// every refresh and adds zoom (wheel), pan (drag), reset (double-click or the button),
// hover details, click-to-pin (synced back as `selected`), fit / 1:1 (`fit`) and, while
// `follow` is on, keeps the newest calls in view. The zoom lives in this closure as a time range on the
// snapshot's clock, so a refresh keeps it. write_report runs this same module in a
// plain page, with a model that only answers `get`.

/**
 * @typedef {{ title: string, rows: [string, string][] }} Details
 * @typedef {{
 *   get(name: string): any,
 *   set(name: string, value: any): void,
 *   save_changes(): void,
 *   on(event: string, callback: () => void): void,
 *   off(event: string, callback: () => void): void,
 * }} Model
 * @typedef {{ a: number, b: number }} Range  seconds from the snapshot's start
 */

const SVGNS = "http://www.w3.org/2000/svg";
// What a card says of a call that left the window since it was hovered or pinned.
const GONE = "not in this window any more";

/**
 * @param {string} tag
 * @param {Record<string, string | number>} attrs
 * @returns {SVGElement}
 */
function svgNode(tag, attrs) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

/**
 * A step of 1, 2 or 5 times a power of ten, about `target` ticks over `length`
 * (the same as timeline_layout.tick_step).
 * @param {number} length
 * @param {number} [target]
 */
function tickStep(length, target = 8) {
  const raw = Math.max(length, 1e-9) / target;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

/**
 * @param {number} t seconds
 * @param {number} step seconds
 */
function tickLabel(t, step) {
  const [unit, scale] = step >= 0.1 ? ["s", 1] : step >= 1e-4 ? ["ms", 1e3] : ["\u00b5s", 1e6];
  const digits = Math.max(0, -Math.floor(Math.log10(step * scale) + 1e-9));
  const text = (t * scale).toFixed(digits);
  return `${Number(text) === 0 ? "0" : text} ${unit}`;
}

/** @param {{ model: Model, el: HTMLElement }} context */
function render({ model, el }) {
  const view = make("div", "nbrpc-timeline-view");
  const bar = make("div", "nbrpc-bar");
  const reset = /** @type {HTMLButtonElement} */ (make("button", "nbrpc-tl-reset", "show all"));
  reset.title = "zoom out to the whole window (or double-click the timeline)";
  const hint = make("span", "nbrpc-tl-hint", "wheel: zoom \u00b7 drag: pan \u00b7 click: pin");
  const status = make("span", "nbrpc-status");
  const host = make("div", "nbrpc-host");
  const tip = make("div", "nbrpc-tip");
  const pin = make("div", "nbrpc-pin");
  const summary = make("div", "nbrpc-tl-summary");
  const fit = fitButton(model, host);
  bar.append(fit.button, reset, hint, status);
  view.append(bar, host, pin, summary, tip);
  el.append(view);

  /** @type {Range | null} */
  let range = null; // null: the whole window
  let origin = 0; // the snapshot's start, to keep a zoom across refreshes whose start moves
  /** @type {string | null} */
  let hovered = null;
  /** @type {{ x: number, range: Range, moved: boolean } | null} */
  let drag = null;
  let dragged = false;

  const root = () => /** @type {SVGSVGElement | null} */ (host.querySelector("svg.nbrpc-timeline"));
  const num = (/** @type {string} */ name) => Number(root()?.getAttribute(name) || 0);
  const full = () => ({ a: num("data-t0"), b: num("data-t1") });
  /** @returns {Record<string, Details>} */
  const details = () => model.get("details") || {};

  /** @returns {Range} */
  function shown() {
    return range || full();
  }

  /** Clamp a range into the window, keeping its length where it fits. */
  function clamp(/** @type {Range} */ r) {
    const w = full();
    const length = Math.min(Math.max(r.b - r.a, (w.b - w.a) * 1e-6, 1e-7), w.b - w.a);
    const a = Math.max(w.a, Math.min(r.a, w.b - length));
    return { a, b: a + length };
  }

  function drawAxis() {
    const svg = root();
    if (!svg) return;
    const axis = svg.querySelector(".nbrpc-tl-axis");
    if (!axis) return;
    const { a, b } = shown();
    if (!(b > a)) return;
    const [x0, y0, w, h] = ["data-plot-x", "data-plot-y", "data-plot-w", "data-plot-h"].map(num);
    const bottom = y0 + h;
    const nodes = [svgNode("line", { x1: x0, y1: bottom, x2: x0 + w, y2: bottom, stroke: "#595959", "stroke-width": 0.8, class: "nbrpc-line" })];
    const step = tickStep(b - a);
    for (let k = Math.ceil(a / step - 1e-9); k * step <= b + 1e-12; k++) {
      const x = x0 + ((k * step - a) / (b - a)) * w;
      nodes.push(svgNode("line", { x1: x, y1: y0, x2: x, y2: bottom + 4, stroke: "#d0d4d9", "stroke-width": 0.6, class: "nbrpc-rule" }));
      const label = svgNode("text", { class: "nbrpc-tl-tick", x, y: bottom + 15, "text-anchor": "middle" });
      label.textContent = tickLabel(k * step, step);
      nodes.push(label);
    }
    axis.replaceChildren(...nodes);
  }

  function applyRange() {
    const svg = root();
    const plot = svg?.querySelector(".nbrpc-tl-plot");
    if (!svg || !plot) return;
    const w = full();
    const { a, b } = shown();
    const pw = num("data-plot-w");
    const ph = num("data-plot-h");
    const scale = pw / (w.b - w.a);
    plot.setAttribute("viewBox", `${(a - w.a) * scale} 0 ${(b - a) * scale} ${ph}`);
    reset.disabled = range === null;
    drawAxis();
  }

  function mark() {
    for (const item of host.querySelectorAll(".nbrpc-hover,.nbrpc-selected,.nbrpc-lit")) {
      item.classList.remove("nbrpc-hover", "nbrpc-selected", "nbrpc-lit");
    }
    const selected = model.get("selected") || "";
    for (const [id, cls] of [[hovered, "nbrpc-hover"], [selected, "nbrpc-selected"]]) {
      if (!id) continue;
      host.querySelector(`[data-id="${CSS.escape(id)}"]`)?.classList.add(cls);
      for (const line of host.querySelectorAll(`[data-call="${CSS.escape(id)}"]`)) line.classList.add("nbrpc-lit");
    }
  }

  function showTip() {
    if (hovered === null) {
      tip.style.display = "none";
      return;
    }
    tip.replaceChildren(table(details()[hovered], hovered, GONE));
    tip.style.display = "block";
  }

  function showPin() {
    const id = model.get("selected") || "";
    pin.style.display = id ? "block" : "none";
    if (id) pin.replaceChildren(make("span", "nbrpc-pin-label", "pinned (click again to unpin)"), table(details()[id], id, GONE));
  }

  function swap() {
    const before = full();
    const wasAtEnd = range !== null && Math.abs(range.b - before.b) < (before.b - before.a) * 1e-3;
    const template = document.createElement("template");
    template.innerHTML = model.get("svg") || "";
    host.replaceChildren(template.content);
    const newOrigin = num("data-origin");
    if (range !== null) {
      // The zoom is kept on the snapshot's clock; a live view that was showing the
      // newest calls slides along with them.
      const shift = origin - newOrigin;
      range = { a: range.a + shift, b: range.b + shift };
      if (model.get("follow") && wasAtEnd) {
        const length = range.b - range.a;
        range = { a: full().b - length, b: full().b };
      }
      range = clamp(range);
    }
    origin = newOrigin;
    applyRange();
    mark();
    showTip();
    showPin();
  }

  /** Plot x (0..1) of a mouse event, through however the page scaled the SVG. */
  function fraction(/** @type {MouseEvent} */ event) {
    const svg = root();
    if (!svg) return 0.5;
    const box = svg.getBoundingClientRect();
    const scale = box.width / Number(svg.getAttribute("width") || box.width || 1);
    const x = (event.clientX - box.left) / scale - num("data-plot-x");
    return Math.min(1, Math.max(0, x / num("data-plot-w")));
  }

  /** @param {WheelEvent} event */
  function onWheel(event) {
    if (!root()) return;
    event.preventDefault();
    const r = shown();
    const at = r.a + fraction(event) * (r.b - r.a);
    const factor = Math.exp(Math.max(-1, Math.min(1, event.deltaY * 0.002)));
    const next = clamp({ a: at - (at - r.a) * factor, b: at + (r.b - at) * factor });
    const w = full();
    range = next.b - next.a >= (w.b - w.a) * 0.999 ? null : next;
    applyRange();
  }

  /** @param {MouseEvent} event */
  function onDown(event) {
    if (event.button !== 0) return;
    drag = { x: event.clientX, range: shown(), moved: false };
  }

  /** @param {MouseEvent} event */
  function onMove(event) {
    if (drag) {
      const dx = event.clientX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      if (drag.moved) {
        const svg = root();
        const box = svg ? svg.getBoundingClientRect() : { width: 1 };
        const scale = box.width / Number(svg?.getAttribute("width") || 1);
        const seconds = (-dx / scale / num("data-plot-w")) * (drag.range.b - drag.range.a);
        const next = clamp({ a: drag.range.a + seconds, b: drag.range.b + seconds });
        const w = full();
        range = next.b - next.a >= (w.b - w.a) * 0.999 && next.a <= w.a ? null : next;
        applyRange();
      }
    }
    const target = /** @type {Element} */ (event.target);
    const item = target.closest ? target.closest("[data-id]") : null;
    const id = item && host.contains(item) ? item.getAttribute("data-id") : null;
    if (id !== hovered) {
      hovered = id;
      mark();
      showTip();
    }
    if (hovered !== null) {
      placeTip(tip, view, event);
    }
  }

  function onUp() {
    dragged = !!drag?.moved;
    drag = null;
  }

  function onLeave() {
    drag = null;
    hovered = null;
    mark();
    showTip();
  }

  /** @param {MouseEvent} event */
  function onClick(event) {
    if (dragged) {
      dragged = false;
      return;
    }
    const target = /** @type {Element} */ (event.target);
    const item = target.closest ? target.closest("[data-id]") : null;
    const id = (item && host.contains(item) ? item.getAttribute("data-id") : "") || "";
    model.set("selected", id === model.get("selected") ? "" : id);
    model.save_changes();
  }

  function showAll() {
    range = null;
    applyRange();
  }

  const onStatus = () => {
    status.textContent = model.get("status") || "";
  };
  const onTable = () => {
    summary.innerHTML = model.get("table") || ""; // Python's own HTML, values escaped there
  };
  const onDetails = () => {
    showTip();
    showPin();
  };
  const onSelected = () => {
    mark();
    showPin();
  };

  host.addEventListener("wheel", onWheel, { passive: false });
  host.addEventListener("mousedown", onDown);
  host.addEventListener("mousemove", onMove);
  host.addEventListener("mouseup", onUp);
  host.addEventListener("mouseleave", onLeave);
  host.addEventListener("click", onClick);
  host.addEventListener("dblclick", showAll);
  reset.addEventListener("click", showAll);
  model.on("change:svg", swap);
  model.on("change:details", onDetails);
  model.on("change:selected", onSelected);
  model.on("change:status", onStatus);
  model.on("change:table", onTable);
  if (model.on) model.on("change:fit", fit.show);
  swap();
  onStatus();
  onTable();
  fit.show();

  return () => {
    model.off("change:svg", swap);
    model.off("change:details", onDetails);
    model.off("change:selected", onSelected);
    model.off("change:status", onStatus);
    model.off("change:table", onTable);
    model.off("change:fit", fit.show);
  };
}

export default { render };

// Front end of nbrpc's RRef and autograd graphs (an anywidget ES module, no bundler).
//
// Python draws the SVG (trait `svg`) and the hover details (trait `details`, keyed by
// each item's data-id). This module puts the SVG in the page and swaps it in place on
// every refresh, and adds hover details, click-to-pin (synced back as `selected`), the
// fork-history toggle (`show_forks`), the worker filter (`worker`) and fit / 1:1 (`fit`).
// All of them survive refreshes because they live in the model and in this closure, not
// in the SVG.

/**
 * @typedef {{ title: string, rows: [string, string][] }} Details
 * @typedef {{
 *   get(name: string): any,
 *   set(name: string, value: any): void,
 *   save_changes(): void,
 *   on(event: string, callback: () => void): void,
 *   off(event: string, callback: () => void): void,
 * }} Model
 */

// What a card says of an item that left the snapshot since it was hovered or pinned.
const GONE = "gone (no longer in the snapshot)";

/** @param {{ model: Model, el: HTMLElement }} context */
function render({ model, el }) {
  const view = make("div", "nbrpc-graph");
  const bar = make("div", "nbrpc-bar");
  const forkBox = make("label", "nbrpc-forks-toggle");
  const forks = /** @type {HTMLInputElement} */ (make("input"));
  forks.type = "checkbox";
  forkBox.append(forks, " fork history");
  const filterBox = make("label", "", "worker ");
  const filter = /** @type {HTMLSelectElement} */ (make("select", "nbrpc-filter"));
  filterBox.append(filter);
  const status = make("span", "nbrpc-status");
  const host = make("div", "nbrpc-host");
  const tip = make("div", "nbrpc-tip");
  const pin = make("div", "nbrpc-pin");
  const fit = fitButton(model, host);
  bar.append(fit.button);
  if (model.get("kind") === "rref") bar.append(forkBox);
  bar.append(filterBox, status);
  view.append(bar, host, pin, tip);
  el.append(view);

  /** @type {string | null} */
  let hovered = null;
  let lanes = "";

  /** @param {string} id */
  const itemOf = (id) => host.querySelector(`[data-id="${CSS.escape(id)}"]`);
  /** Edges of an item: holder edges of an RRef, in and out edges of a function. */
  const edgesOf = (/** @type {string} */ id) => {
    const q = CSS.escape(id);
    return host.querySelectorAll(`[data-rref="${q}"],[data-src="${q}"],[data-dst="${q}"]`);
  };
  /** @returns {Record<string, Details>} */
  const details = () => model.get("details") || {};

  function syncLanes() {
    const names = Array.from(host.querySelectorAll("[data-lane]"), (n) => n.getAttribute("data-lane") || "");
    const key = names.join("\u0000");
    if (key === lanes) return;
    lanes = key;
    filter.replaceChildren(make("option", "", "all"));
    /** @type {HTMLOptionElement} */ (filter.firstChild).value = "";
    for (const name of names) {
      const option = /** @type {HTMLOptionElement} */ (make("option", "", name));
      option.value = name;
      filter.append(option);
    }
  }

  function applyFilter() {
    const worker = model.get("worker") || "";
    filter.value = worker;
    for (const item of host.querySelectorAll("[data-workers]")) {
      const related = (item.getAttribute("data-workers") || "").split(" ");
      const lane = item.hasAttribute("data-lane");
      const out = worker !== "" && !related.includes(worker);
      item.classList.toggle(lane ? "nbrpc-dim" : "nbrpc-off", out);
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
    if (id) {
      const label = make("span", "nbrpc-pin-label", "pinned (click again to unpin)");
      pin.replaceChildren(label, table(details()[id], id, GONE));
    }
  }

  // Highlights are re-applied after every swap: the new SVG has fresh elements.
  function mark() {
    for (const item of host.querySelectorAll(".nbrpc-hover,.nbrpc-selected,.nbrpc-lit")) {
      item.classList.remove("nbrpc-hover", "nbrpc-selected", "nbrpc-lit");
    }
    const selected = model.get("selected") || "";
    for (const [id, cls] of [[hovered, "nbrpc-hover"], [selected, "nbrpc-selected"]]) {
      if (!id) continue;
      itemOf(id)?.classList.add(cls);
      for (const edge of edgesOf(id)) edge.classList.add("nbrpc-lit");
    }
  }

  function swap() {
    const template = document.createElement("template");
    template.innerHTML = model.get("svg") || "";
    // One synchronous replacement: the browser never paints an empty host.
    host.replaceChildren(template.content);
    syncLanes();
    applyFilter();
    mark();
    showTip();
    showPin();
  }

  /** @param {Event} event */
  const idAt = (event) => {
    const target = /** @type {Element} */ (event.target);
    const item = target.closest ? target.closest("[data-id]") : null;
    return item && host.contains(item) ? item.getAttribute("data-id") : null;
  };

  /** @param {MouseEvent} event */
  function onMove(event) {
    const id = idAt(event);
    if (id !== hovered) {
      hovered = id;
      mark();
      showTip();
    }
    if (hovered !== null) {
      placeTip(tip, view, event);
    }
  }

  function onLeave() {
    hovered = null;
    mark();
    showTip();
  }

  /** @param {MouseEvent} event */
  function onClick(event) {
    const id = idAt(event) || "";
    model.set("selected", id === model.get("selected") ? "" : id);
    model.save_changes();
  }

  function onForks() {
    model.set("show_forks", forks.checked);
    model.save_changes();
  }

  function onFilter() {
    model.set("worker", filter.value);
    model.save_changes();
  }

  const onShowForks = () => {
    forks.checked = !!model.get("show_forks");
    view.classList.toggle("nbrpc-forks-on", forks.checked);
  };
  const onStatus = () => {
    status.textContent = model.get("status") || "";
  };
  // Python sets svg and details in one message; by change:svg both are new.
  const onDetails = () => {
    showTip();
    showPin();
  };
  const onSelected = () => {
    mark();
    showPin();
  };

  host.addEventListener("mousemove", onMove);
  host.addEventListener("mouseleave", onLeave);
  host.addEventListener("click", onClick);
  forks.addEventListener("change", onForks);
  filter.addEventListener("change", onFilter);
  model.on("change:svg", swap);
  model.on("change:details", onDetails);
  model.on("change:selected", onSelected);
  model.on("change:worker", applyFilter);
  model.on("change:show_forks", onShowForks);
  model.on("change:status", onStatus);
  model.on("change:fit", fit.show);
  swap();
  onShowForks();
  onStatus();
  fit.show();

  return () => {
    model.off("change:svg", swap);
    model.off("change:details", onDetails);
    model.off("change:selected", onSelected);
    model.off("change:worker", applyFilter);
    model.off("change:show_forks", onShowForks);
    model.off("change:status", onStatus);
    model.off("change:fit", fit.show);
  };
}

export default { render };

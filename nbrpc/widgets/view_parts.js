// Parts both of nbrpc's front ends use (graph.js, timeline.js): element making, the
// details table, hover-card placement and the fit / 1:1 button. Python puts this file
// before each module's own text (``widgets/base.py`` ``esm``), as plain declarations.

/**
 * @param {string} tag
 * @param {string} [className]
 * @param {string} [text]
 * @returns {HTMLElement}
 */
function make(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/**
 * A details table; values go in as text, never as HTML.
 * @param {Details | undefined} details
 * @param {string} id
 * @param {string} gone what to say when `details` has no entry for `id`
 * @returns {HTMLElement}
 */
function table(details, id, gone) {
  const box = make("div");
  if (!details) {
    box.append(make("b", "", `${id}: ${gone}`));
    return box;
  }
  box.append(make("b", "", details.title));
  const rows = make("table");
  for (const [label, value] of details.rows) {
    const tr = make("tr");
    tr.append(make("td", "nbrpc-key", label), make("td", "", value));
    rows.append(tr);
  }
  box.append(rows);
  return box;
}

/**
 * Put a hover card next to the pointer where it shows whole. The card is fixed to the
 * window, so the output area around a widget (which clips what sticks out of it) does
 * not cut it: across, it stays inside the view; down, inside the view when it fits
 * there, else over the output, inside the notebook's scrolling area and the window.
 * Right of and below the pointer when there is room, else left of or above it.
 * @param {HTMLElement} tip
 * @param {HTMLElement} view
 * @param {MouseEvent} event
 */
function placeTip(tip, view, event) {
  const gap = 14;
  const box = view.getBoundingClientRect();
  tip.style.maxWidth = `${Math.max(160, Math.min(460, box.width - 8))}px`;
  const w = tip.offsetWidth;
  const h = tip.offsetHeight;
  const scroller = view.closest(".jp-WindowedPanel-outer, .jp-Notebook, .jp-NotebookPanel");
  const area = scroller ? scroller.getBoundingClientRect() : { top: 0, bottom: window.innerHeight };
  const left = Math.max(box.left, 0);
  const right = Math.min(box.right, window.innerWidth);
  const room = Math.max(event.clientY - box.top, box.bottom - event.clientY) - gap;
  const top = Math.max(h <= room ? box.top : area.top, 0);
  const bottom = Math.min(h <= room ? box.bottom : area.bottom, window.innerHeight);
  let x = event.clientX + gap + w <= right ? event.clientX + gap : event.clientX - gap - w;
  let y = event.clientY + gap + h <= bottom ? event.clientY + gap : event.clientY - gap - h;
  x = Math.max(left, Math.min(x, right - w));
  y = Math.max(top, Math.min(y, bottom - h));
  tip.style.left = `${Math.round(x)}px`;
  tip.style.top = `${Math.round(y)}px`;
  // A transformed or contained ancestor makes "fixed" relative to itself: correct for it.
  const got = tip.getBoundingClientRect();
  if (Math.abs(got.left - x) > 0.5 || Math.abs(got.top - y) > 0.5) {
    tip.style.left = `${Math.round(2 * x - got.left)}px`;
    tip.style.top = `${Math.round(2 * y - got.top)}px`;
  }
}

/**
 * The fit / 1:1 button: fitted, a drawing shrinks to the output's width; at 1:1 it
 * keeps its own size and the box scrolls. The choice lives in the model (`fit`).
 * @param {Model} model
 * @param {HTMLElement} host
 */
function fitButton(model, host) {
  const button = /** @type {HTMLButtonElement} */ (make("button", "nbrpc-fit-toggle"));
  const show = () => {
    const fit = model.get("fit") !== false;
    host.classList.toggle("nbrpc-fit", fit);
    button.textContent = fit ? "1:1" : "fit";
    button.title = fit ? "show the drawing at its own size (scroll to see it all)" : "fit the drawing to the width";
  };
  button.addEventListener("click", () => {
    model.set("fit", model.get("fit") === false);
    model.save_changes();
  });
  return { button, show };
}


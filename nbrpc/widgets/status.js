// Front end of nbrpc.ClusterStatus: Python renders the table; this shows it and
// replaces it in place on every refresh.

/**
 * @typedef {{
 *   get(name: string): any,
 *   on(event: string, callback: () => void): void,
 *   off(event: string, callback: () => void): void,
 * }} Model
 */

/** @param {{ model: Model, el: HTMLElement }} context */
function render({ model, el }) {
  const table = document.createElement("div");
  // JupyterLab's rendered-HTML class: the table looks as %rpc_status's output does.
  table.className = "jp-RenderedHTMLCommon nbrpc-status-table";
  const status = document.createElement("div");
  status.className = "nbrpc-status-line";
  el.append(table, status);
  const show = () => {
    // The HTML is nbrpc's own table, every value escaped in Python.
    table.innerHTML = model.get("html") || "";
    status.textContent = model.get("status") || "";
  };
  model.on("change:html", show);
  model.on("change:status", show);
  show();
  return () => {
    model.off("change:html", show);
    model.off("change:status", show);
  };
}

export default { render };

// The widgets' own front ends, as the kernel sends them (the ES module anywidget loads in a
// cell's output): each text becomes a module once, from a Blob URL, as anywidget does.
import type { ViewModel } from './model';

/** What a widget's module does with a model and an element; it may return its cleanup. */
export type Render = (context: {
  model: ViewModel;
  el: HTMLElement;
}) => void | (() => void) | Promise<void | (() => void)>;

/** The widget's front end as the kernel sends it. */
export interface IFrontEnd {
  esm: string;
  css: string;
}

const modules = new Map<string, Promise<Render>>();

/** The ``render`` of the module ``esm`` (``export default { render }`` or ``export { render }``). */
export function loadRender(esm: string): Promise<Render> {
  let loading = modules.get(esm);
  if (!loading) {
    loading = importText(esm);
    modules.set(esm, loading);
    loading.catch(() => modules.delete(esm));
  }
  return loading;
}

async function importText(esm: string): Promise<Render> {
  const url = URL.createObjectURL(new Blob([esm], { type: 'text/javascript' }));
  try {
    const module = await import(/* webpackIgnore: true */ url);
    const render = module.default?.render ?? module.render;
    if (typeof render !== 'function') {
      throw new Error("the view's front end has no render function");
    }
    return render as Render;
  } finally {
    URL.revokeObjectURL(url);
  }
}

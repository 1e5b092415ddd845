// The model a docked view hands the widgets' own ES modules: what their render({model, el})
// reads (get, on/off "change:name") and sets (set, save_changes), as an anywidget model is,
// fed by the server's endpoint (update) instead of a comm. Pure: tested without a page.
import { ISignal, Signal } from '@lumino/signaling';

/** A widget's synced state: trait name -> value (JSON). */
export type State = Record<string, unknown>;

type Listener = () => void;

export class ViewModel {
  /**
   * @param prepare what a value of the kernel's becomes before the front end reads it (its
   * HTML through JupyterLab's sanitizer); by default, itself.
   */
  constructor(private prepare: (name: string, value: unknown) => unknown = (_, v) => v) {}

  /** A trait's value (undefined until the kernel or the front end gives one). */
  get(name: string): any {
    return this.values[name];
  }

  /** The front end's choice (pin, filter, fit, fork history): kept over the kernel's. */
  set(name: string, value: unknown): void {
    this.chosen.add(name);
    if (this.values[name] !== value) {
      this.values[name] = value;
      this.emit([name]);
    }
  }

  /** The front end's choices are final: the view asks the kernel again with them. */
  save_changes(): void {
    this._saved.emit(this.choices());
  }

  on(event: string, callback: Listener): void {
    const name = nameOf(event);
    if (name !== null) {
      (this.listeners[name] ||= new Set()).add(callback);
    }
  }

  off(event: string, callback: Listener): void {
    const name = nameOf(event);
    if (name !== null) {
      this.listeners[name]?.delete(callback);
    }
  }

  /**
   * The kernel's new state. Every changed value is in place before any listener runs (a
   * drawing and its hover details arrive together, as in one comm message); values the
   * front end chose stay. Returns the names that changed.
   */
  update(state: State): string[] {
    const changed: string[] = [];
    for (const [name, raw] of Object.entries(state)) {
      if (this.chosen.has(name)) {
        continue;
      }
      const value = this.prepare(name, raw);
      if (!same(this.values[name], value)) {
        this.values[name] = value;
        changed.push(name);
      }
    }
    this.emit(changed);
    return changed;
  }

  /** The values the front end chose, by name. */
  choices(): State {
    return Object.fromEntries([...this.chosen].map(name => [name, this.values[name]]));
  }

  /** Emitted by save_changes with the front end's choices. */
  get saved(): ISignal<this, State> {
    return this._saved;
  }

  private emit(names: string[]): void {
    for (const name of names) {
      for (const callback of [...(this.listeners[name] || [])]) {
        callback();
      }
    }
  }

  private values: State = {};
  private chosen = new Set<string>();
  private listeners: Record<string, Set<Listener>> = {};
  private _saved = new Signal<this, State>(this);
}

/** The trait an event names ("change:svg" -> "svg"), or null for another event. */
function nameOf(event: string): string | null {
  return event.startsWith('change:') ? event.slice('change:'.length) : null;
}

/** Whether two JSON values are equal (a refresh that changed nothing redraws nothing). */
function same(a: unknown, b: unknown): boolean {
  if (a === b) {
    return true;
  }
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) {
    return false;
  }
  return JSON.stringify(a) === JSON.stringify(b);
}

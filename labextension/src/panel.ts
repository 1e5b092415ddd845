// The side panel: every nbrpc cluster of this server's kernels, asked by one Poll.
import { Notification } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import * as api from './api';
import { CommandIDs } from './commands';
import { startForm } from './form';
import { memberTable } from './members';
import { VIEWS } from './protocol';

// After a failed request the poll backs off up to this, then asks at its interval again.
const MAX_MS = 30_000;
// With the panel hidden and no cluster, the poll asks this many times less often.
const IDLE_FACTOR = 3;

export interface IPanelOptions {
  commands: CommandRegistry;
  trans: TranslationBundle;
  /** Milliseconds between two requests while the page is visible. */
  interval: number;
  /** Whether a stuck cell raises a notification. */
  notifications: boolean;
}

function el(tag: string, cls = '', text = ''): HTMLElement {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

/** Where a cluster lives, in words: its notebook's path, or its kernel. */
export function whereOf(c: api.ICluster): string {
  return c.path || c.name || `kernel ${c.kernel_id.slice(0, 8)}`;
}

export class ClustersPanel extends Widget {
  constructor(options: IPanelOptions) {
    super();
    this.commands = options.commands;
    this.trans = options.trans;
    this.notifications = options.notifications;
    this.id = 'nbrpc-panel';
    this.addClass('nbrpc-panel');
    this.title.caption = 'nbrpc';
    this.title.label = 'nbrpc';
    this.list = el('div', 'nbrpc-clusters');
    this.message = el('div', 'nbrpc-message');
    this.node.append(
      el('h2', 'nbrpc-panel-title', 'nbrpc'),
      this.list,
      this.message,
      startForm(this.trans, line => void this.commands.execute(CommandIDs.start, { line }))
    );
    this.interval = options.interval;
    // One poll for the cluster list: it backs off while the server fails and stands by
    // while the page is hidden; visible again, it asks at once.
    this.poll = new Poll({
      name: 'nbrpc:clusters',
      factory: () => this.ask(),
      frequency: { interval: this.interval, backoff: true, max: MAX_MS },
      standby: 'when-hidden',
      linger: 0
    });
    document.addEventListener('visibilitychange', this.onVisibility);
  }

  /** Emitted with every answer: the clusters of this server's kernels. */
  get changed(): ISignal<this, api.ICluster[]> {
    return this._changed;
  }

  /** The clusters of the last answer. */
  get clusters(): readonly api.ICluster[] {
    return this.found;
  }

  /** Milliseconds between two requests while the page is visible (the setting). */
  set interval(ms: number) {
    this._interval = Math.max(200, ms);
    if (this.poll) {
      this.poll.frequency = { interval: this._interval, backoff: true, max: MAX_MS };
      void this.poll.refresh();
    }
  }

  get interval(): number {
    return this._interval;
  }

  /** Whether a stuck cell raises a notification (the setting). */
  notifications: boolean;

  /** Ask now. */
  refresh(): Promise<void> {
    return this.poll.refresh();
  }

  /** Say what an action answered, under the list. */
  say(text: string, error = false): void {
    this.message.textContent = text;
    this.message.classList.toggle('nbrpc-error', error);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    document.removeEventListener('visibilitychange', this.onVisibility);
    this.poll.dispose();
    this.clearNotices();
    Signal.clearData(this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
  }

  private onVisibility = (): void => {
    if (document.visibilityState === 'visible') {
      void this.refresh();
    }
  };

  /** One tick: ask the server; redraw; raise or clear notifications. Rejects on failure,
   * so that the poll backs off. */
  private async ask(): Promise<void> {
    const visible = this.isVisible;
    let found: api.ICluster[];
    try {
      found = await api.clusters(visible);
    } catch (e) {
      this.list.replaceChildren(
        el('div', 'nbrpc-error', this.trans.__('nbrpc: the server did not answer (%1)', String(e)))
      );
      throw e;
    }
    this.found = found;
    if (visible) {
      this.draw(found);
    }
    this.notify(found);
    this._changed.emit(found);
    const idle = !visible && !found.length;
    this.poll.frequency = {
      interval: idle ? this.interval * IDLE_FACTOR : this.interval,
      backoff: true,
      max: MAX_MS
    };
  }

  private draw(found: api.ICluster[]): void {
    if (!found.length) {
      this.list.replaceChildren(
        el(
          'div',
          'nbrpc-empty',
          this.trans.__(
            "No nbrpc cluster runs in this server's kernels. Start one below, or with %rpc_init in a notebook."
          )
        )
      );
      return;
    }
    this.list.replaceChildren(...found.map(c => this.entry(c)));
  }

  private entry(c: api.ICluster): HTMLElement {
    const box = el('div', 'nbrpc-cluster');
    box.dataset.kernelId = c.kernel_id;
    box.append(el('div', 'nbrpc-cluster-where', whereOf(c)));
    const info = c.cluster;
    if (!info) {
      box.append(el('div', 'nbrpc-error', c.error || this.trans.__('no answer')));
      return box;
    }
    box.classList.toggle('nbrpc-stuck', info.findings.length > 0);
    for (const f of info.findings) {
      box.append(el('div', 'nbrpc-finding', this.trans.__('stuck (%1): %2', f.kind, f.message)));
    }
    box.append(this.members(info.members));
    box.append(this.actions(c));
    return box;
  }

  private actions(c: api.ICluster): HTMLElement {
    const info = c.cluster!;
    const kernelId = c.kernel_id;
    const bar = el('div', 'nbrpc-actions');
    for (const v of VIEWS) {
      if ((v.name === 'timeline' && !info.trace) || (v.name === 'autograd' && !info.autograd)) {
        continue;
      }
      bar.append(
        this.button(this.trans.__(v.label), `nbrpc-open-${v.id}`, CommandIDs.openView, {
          kernelId,
          view: v.name
        })
      );
    }
    if (info.waiting) {
      bar.append(
        this.button(this.trans.__('Stop call'), 'nbrpc-stop', CommandIDs.stop, { kernelId })
      );
    }
    bar.append(
      this.button(this.trans.__('Shut down'), 'nbrpc-shutdown', CommandIDs.shutdown, { kernelId })
    );
    return bar;
  }

  private members(rows: api.IMember[]): HTMLElement {
    const table = el('table', 'nbrpc-members');
    const text = memberTable(rows);
    const head = el('tr');
    head.append(...text.headings.map(h => el('th', '', this.trans.__(h))));
    table.append(head);
    for (const row of text.rows) {
      const tr = el('tr');
      tr.append(...row.map(cell => el('td', '', cell)));
      table.append(tr);
    }
    return table;
  }

  private button(
    label: string,
    cls: string,
    command: string,
    args: Record<string, string>
  ): HTMLElement {
    const b = el('button', `jp-Button jp-mod-styled jp-mod-reject nbrpc-button ${cls}`, label);
    b.addEventListener('click', () => void this.commands.execute(command, args));
    return b;
  }

  /** A notification per stuck cluster, naming its notebook; dismissed once it clears. */
  private notify(found: api.ICluster[]): void {
    const stuck = new Map<string, api.ICluster>();
    for (const c of found) {
      if (this.notifications && c.cluster && c.cluster.findings.length) {
        stuck.set(c.kernel_id, c);
      }
    }
    for (const [kernelId, id] of this.notices) {
      if (!stuck.has(kernelId)) {
        Notification.dismiss(id);
        this.notices.delete(kernelId);
      }
    }
    for (const [kernelId, c] of stuck) {
      if (!this.notices.has(kernelId)) {
        this.notices.set(kernelId, this.stuckNotice(c));
      }
    }
  }

  private stuckNotice(c: api.ICluster): string {
    const kernelId = c.kernel_id;
    const open = (view: string) => () =>
      void this.commands.execute(CommandIDs.openView, { kernelId, view });
    const message = c.cluster!.findings[0].message;
    return Notification.error(
      this.trans.__('nbrpc: a cell of %1 is stuck: %2', whereOf(c), message),
      {
        autoClose: false,
        actions: [
          { label: this.trans.__('Wait-for graph'), callback: open('waits') },
          { label: this.trans.__('Stacks'), callback: open('stacks') }
        ]
      }
    );
  }

  private clearNotices(): void {
    for (const id of this.notices.values()) {
      Notification.dismiss(id);
    }
    this.notices.clear();
  }

  private commands: CommandRegistry;
  private trans: TranslationBundle;
  private list: HTMLElement;
  private message: HTMLElement;
  private poll: Poll;
  private found: api.ICluster[] = [];
  private _interval = 1000;
  private _changed = new Signal<this, api.ICluster[]>(this);
  private notices = new Map<string, string>();
}

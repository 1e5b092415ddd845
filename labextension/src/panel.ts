// The side panel: every nbrpc cluster of this server's kernels, refreshed every second.
import { Notification } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import * as api from './api';
import { startForm } from './form';
import { VIEWS } from './view';

const REFRESH_MS = 1000;
// Hidden, the panel still looks for stuck cells (the notification), without members' rows.
const HIDDEN_MS = 1000;
const IDLE_MS = 3000;

export interface IPanelActions {
  open(kernelId: string, view: string): void;
  shutdown(kernelId: string): void;
  start(line: string): void;
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
  constructor(private actions: IPanelActions) {
    super();
    this.id = 'nbrpc-panel';
    this.addClass('nbrpc-panel');
    this.title.caption = 'nbrpc';
    this.title.label = 'nbrpc';
    const head = el('h2', 'nbrpc-panel-title', 'nbrpc');
    this.list = el('div', 'nbrpc-clusters');
    this.node.append(
      head,
      this.list,
      startForm(line => this.actions.start(line))
    );
    this.schedule(0);
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    this.schedule(0);
  }

  private schedule(ms: number): void {
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => this.refresh(), ms);
  }

  /** Ask the server; redraw; raise or clear notifications; ask again. */
  async refresh(): Promise<void> {
    const visible = this.isVisible;
    let found: api.ICluster[] | null = null;
    try {
      found = await api.clusters(visible);
    } catch (e) {
      this.list.replaceChildren(
        el('div', 'nbrpc-error', `nbrpc: the server did not answer (${e})`)
      );
    }
    if (found !== null) {
      if (visible) {
        this.draw(found);
      }
      this.notify(found);
    }
    if (!this.isDisposed) {
      this.schedule(visible ? REFRESH_MS : found && found.length ? HIDDEN_MS : IDLE_MS);
    }
  }

  private draw(found: api.ICluster[]): void {
    if (!found.length) {
      this.list.replaceChildren(
        el(
          'div',
          'nbrpc-empty',
          "No nbrpc cluster runs in this server's kernels. Start one below, or with %rpc_init in a notebook."
        )
      );
      return;
    }
    this.list.replaceChildren(...found.map(c => this.entry(c)));
  }

  /** Told each cluster's notebook, so that its views' titles name it. */
  onWhere: (kernelId: string, where: string) => void = () => undefined;

  private entry(c: api.ICluster): HTMLElement {
    this.onWhere(c.kernel_id, whereOf(c));
    const box = el('div', 'nbrpc-cluster');
    box.dataset.kernelId = c.kernel_id;
    const where = whereOf(c);
    box.append(el('div', 'nbrpc-cluster-where', where));
    const info = c.cluster;
    if (!info) {
      box.append(el('div', 'nbrpc-error', c.error || 'no answer'));
      return box;
    }
    const stuck = info.findings.length > 0;
    box.classList.toggle('nbrpc-stuck', stuck);
    for (const f of info.findings) {
      box.append(el('div', 'nbrpc-finding', `stuck (${f.kind}): ${f.message}`));
    }
    box.append(this.members(info.members));
    const bar = el('div', 'nbrpc-actions');
    for (const v of VIEWS) {
      if ((v.name === 'timeline' && !info.trace) || (v.name === 'autograd' && !info.autograd)) {
        continue;
      }
      bar.append(
        this.button(v.label, `nbrpc-open-${v.id}`, () => this.actions.open(c.kernel_id, v.id))
      );
    }
    if (info.waiting) {
      bar.append(
        this.button('Stop call', 'nbrpc-stop', () => {
          void api.interrupt(c.kernel_id);
        })
      );
    }
    bar.append(
      this.button('Shut down', 'nbrpc-shutdown', () => this.actions.shutdown(c.kernel_id))
    );
    box.append(bar);
    return box;
  }

  private members(rows: api.IMember[]): HTMLElement {
    const table = el('table', 'nbrpc-members');
    const columns: (keyof api.IMember)[] = [
      'name',
      'host',
      'pid',
      'state',
      'devices',
      'busy',
      'owned_rrefs'
    ];
    const head = el('tr');
    for (const name of columns) {
      head.append(el('th', '', name === 'owned_rrefs' ? 'RRefs' : name));
    }
    table.append(head);
    for (const row of rows) {
      const tr = el('tr');
      for (const name of columns) {
        const value = row[name];
        tr.append(el('td', '', value === null || value === undefined ? '-' : String(value)));
      }
      table.append(tr);
    }
    return table;
  }

  private button(label: string, cls: string, act: () => void): HTMLElement {
    const b = el('button', `jp-Button jp-mod-styled jp-mod-reject nbrpc-button ${cls}`, label);
    b.addEventListener('click', act);
    return b;
  }

  /** A notification per stuck cluster, naming its notebook; dismissed once it clears. */
  private notify(found: api.ICluster[]): void {
    const stuck = new Map<string, api.ICluster>();
    for (const c of found) {
      if (c.cluster && c.cluster.findings.length) {
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
      if (this.notices.has(kernelId)) {
        continue;
      }
      const message = c.cluster!.findings[0].message;
      const id = Notification.error(`nbrpc: a cell of ${whereOf(c)} is stuck: ${message}`, {
        autoClose: false,
        actions: [
          { label: 'Wait-for graph', callback: () => this.actions.open(kernelId, 'waits-graph') },
          { label: 'Stacks', callback: () => this.actions.open(kernelId, 'stacks') }
        ]
      });
      this.notices.set(kernelId, id);
    }
  }

  private list: HTMLElement;
  private timer = 0;
  private notices = new Map<string, string>();
}

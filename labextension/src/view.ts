// A view of a cluster as a main-area panel: the kernel draws it (nbrpc.drawing, the
// widgets' own code); this puts it in the page and refreshes it while it is visible.
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import * as api from './api';

/** The views: command id suffix, label (what the command opens), request name. */
export const VIEWS: { id: string; label: string; name: string }[] = [
  { id: 'rref-graph', label: 'RRef graph', name: 'rref' },
  { id: 'timeline', label: 'Timeline', name: 'timeline' },
  { id: 'waits-graph', label: 'Wait-for graph', name: 'waits' },
  { id: 'autograd-graph', label: 'Autograd graph', name: 'autograd' },
  { id: 'status', label: 'Status', name: 'status' },
  { id: 'stacks', label: 'Stacks', name: 'stacks' }
];

const REFRESH_MS = 1000;

class ViewContent extends Widget {
  constructor(
    readonly kernelId: string,
    readonly name: string
  ) {
    super();
    this.addClass('nbrpc-view');
    this.summary = document.createElement('div');
    this.summary.className = 'nbrpc-view-summary';
    this.host = document.createElement('div');
    this.host.className = 'nbrpc-view-host nbrpc-fit';
    this.node.append(this.summary, this.host);
  }

  protected onAfterAttach(msg: Message): void {
    void this.refresh();
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
  }

  protected onBeforeHide(msg: Message): void {
    this.stopTimer();
  }

  dispose(): void {
    this.stopTimer();
    super.dispose();
  }

  private stopTimer(): void {
    if (this.timer !== null) {
      window.clearTimeout(this.timer);
      this.timer = null;
    }
  }

  /** Ask for the view; again REFRESH_MS after each answer while visible and the cluster runs. */
  async refresh(): Promise<void> {
    this.stopTimer();
    let ended = false;
    try {
      const answer = await api.view(this.kernelId, this.name);
      if (answer.error) {
        this.summary.textContent = `nbrpc: ${answer.error}`;
      } else {
        ended = !!answer.ended;
        this.summary.textContent = answer.summary || '';
        // No html: the kernel keeps the last drawing (a call of its cell waits).
        if (!ended && answer.html !== undefined) {
          this.swap(answer.html);
        }
      }
    } catch (e) {
      ended = true;
      this.summary.textContent =
        'the cluster has ended (its kernel runs no nbrpc cluster now); this view no longer refreshes';
    }
    this.node.classList.toggle('nbrpc-ended', ended);
    if (ended) {
      this.summary.textContent =
        'the cluster has ended (its kernel runs no nbrpc cluster now); this view no longer refreshes';
      return;
    }
    if (this.isVisible && !this.isDisposed) {
      this.timer = window.setTimeout(() => this.refresh(), REFRESH_MS);
    }
  }

  private swap(html: string): void {
    if (html === this.shown) {
      return;
    }
    this.shown = html;
    const template = document.createElement('template');
    template.innerHTML = html;
    this.host.replaceChildren(template.content);
  }

  private summary: HTMLElement;
  private host: HTMLElement;
  private shown = '';
  private timer: number | null = null;
}

/** A main-area panel showing ``name`` of the cluster in ``kernelId``. */
export function openView(
  kernelId: string,
  name: string,
  label: string,
  where: string
): MainAreaWidget<ViewContent> {
  const content = new ViewContent(kernelId, name);
  const widget = new MainAreaWidget({ content });
  widget.id = `nbrpc-${name}-${kernelId}`;
  widget.title.label = `${label}: ${where}`;
  widget.title.closable = true;
  widget.addClass('nbrpc-view-panel');
  return widget;
}

// A view of a cluster as a main-area panel: the kernel draws it (nbrpc.drawing, the
// widgets' own code); a Poll of its own asks again while it is visible and the cluster runs.
// HTML views (the status table, the stacks) go through JupyterLab's sanitizer, as a cell's
// HTML output does; the SVG drawings are shown as drawn.
import { MainAreaWidget } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { TranslationBundle } from '@jupyterlab/translation';
import { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import * as api from './api';
import { IViewKind } from './protocol';

const MAX_MS = 30_000;

export class ViewContent extends Widget {
  constructor(
    readonly kernelId: string,
    readonly kind: IViewKind,
    private trans: TranslationBundle,
    private sanitizer: IRenderMime.ISanitizer,
    interval: number
  ) {
    super();
    this.addClass('nbrpc-view');
    this.summary = document.createElement('div');
    this.summary.className = 'nbrpc-view-summary';
    this.host = document.createElement('div');
    this.host.className = 'nbrpc-view-host nbrpc-fit';
    this.node.append(this.summary, this.host);
    // Hidden (another tab in front, or the page), the view stands by.
    this.poll = new Poll({
      name: `nbrpc:view-${kind.name}`,
      factory: () => this.ask(),
      frequency: { interval, backoff: true, max: MAX_MS },
      standby: () => !this.isVisible || document.visibilityState === 'hidden',
      auto: false
    });
  }

  /** Whether the cluster ended (the view no longer asks). */
  get ended(): boolean {
    return this.node.classList.contains('nbrpc-ended');
  }

  /** Ask now. */
  refresh(): Promise<void> {
    return this.poll.refresh();
  }

  dispose(): void {
    this.poll.dispose();
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    void this.poll.start();
    void this.refresh();
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
  }

  /** One tick: the kernel's drawing, or the news that the cluster ended. */
  private async ask(): Promise<void> {
    let answer: api.IView;
    try {
      answer = await api.view(this.kernelId, this.kind.name);
    } catch (e) {
      if (e instanceof ServerConnection.ResponseError && e.response.status === 404) {
        return this.end();
      }
      this.summary.textContent = this.trans.__('nbrpc: the server did not answer (%1)', String(e));
      throw e;
    }
    if (answer.ended) {
      return this.end();
    }
    if (answer.error) {
      this.summary.textContent = `nbrpc: ${answer.error}`;
      return;
    }
    this.summary.textContent = answer.summary || '';
    // No html: the kernel keeps the last drawing (a call of its cell waits).
    if (answer.html !== undefined) {
      this.swap(answer.html);
    }
  }

  private end(): void {
    this.node.classList.add('nbrpc-ended');
    this.summary.textContent = this.trans.__(
      'the cluster has ended (its kernel runs no nbrpc cluster now); this view no longer refreshes'
    );
    this.poll.dispose();
  }

  private swap(html: string): void {
    if (html === this.shown) {
      return;
    }
    this.shown = html;
    const template = document.createElement('template');
    template.innerHTML = this.kind.html ? this.sanitizer.sanitize(html) : html;
    this.host.replaceChildren(template.content);
  }

  private summary: HTMLElement;
  private host: HTMLElement;
  private shown = '';
  private poll: Poll;
}

/** A main-area panel showing ``kind`` of the cluster in ``kernelId``. */
export function viewPanel(
  kernelId: string,
  kind: IViewKind,
  where: string,
  trans: TranslationBundle,
  sanitizer: IRenderMime.ISanitizer,
  interval: number
): MainAreaWidget<ViewContent> {
  const content = new ViewContent(kernelId, kind, trans, sanitizer, interval);
  const widget = new MainAreaWidget({ content });
  widget.id = `nbrpc-${kind.name}-${kernelId}`;
  widget.title.label = `${trans.__(kind.label)}: ${where}`;
  widget.title.closable = true;
  widget.addClass('nbrpc-view-panel');
  return widget;
}

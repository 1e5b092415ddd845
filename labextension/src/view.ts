// A view of a cluster as a main-area panel: the widget's own front end (the ES module and CSS
// a cell's output loads through anywidget, sent by the kernel), its model fed by a Poll of the
// view's own instead of a comm, so hover cards, pin, filter and zoom work docked. The poll
// asks again while the view is visible and the cluster runs. HTML the kernel sends (the status
// table, the timeline's summary table, the stacks) goes through JupyterLab's sanitizer, as a
// cell's HTML output does; the SVG drawings are nbrpc's own, every value escaped in Python.
import { MainAreaWidget } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { TranslationBundle } from '@jupyterlab/translation';
import { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import * as api from './api';
import { IFrontEnd, loadRender, Render } from './frontend';
import { State, ViewModel } from './model';
import { IViewKind, VIEW_OPTIONS } from './protocol';

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
    this.host.className = 'nbrpc-view-host';
    this.node.append(this.summary, this.host);
    this.model = new ViewModel((name, value) =>
      name === kind.htmlTrait && typeof value === 'string' ? sanitizer.sanitize(value) : value
    );
    // A choice the kernel draws (the fork history) is asked for at once; the others (pin,
    // filter, fit) are the front end's alone.
    this.model.saved.connect((_, choices) => {
      if (optionsKey(choices) !== this.askedWith) {
        void this.refresh();
      }
    });
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
    const cleanup = this.cleanup;
    this.cleanup = null;
    void cleanup?.then(done => done?.());
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    void this.poll.start();
    void this.refresh();
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
  }

  /** One tick: the widget's state, or the news that the cluster ended. */
  private async ask(): Promise<void> {
    let answer: api.IView;
    const choices = this.model.choices();
    this.askedWith = optionsKey(choices);
    try {
      answer = await api.view(
        this.kernelId,
        this.kind.name,
        !this.rendered && !this.kind.html,
        choices
      );
    } catch (e) {
      if (e instanceof ServerConnection.ResponseError && e.response.status === 404) {
        return this.end();
      }
      this.say(this.trans.__('nbrpc: the server did not answer (%1)', String(e)));
      throw e;
    }
    if (answer.ended) {
      return this.end();
    }
    if (answer.error) {
      return this.say(`nbrpc: ${answer.error}`);
    }
    if (answer.front_end) {
      this.style(answer.front_end);
      this.rendered = loadRender(answer.front_end.esm);
    }
    if (answer.state) {
      // The widget's own status line shows the summary; the view's line is for news.
      this.say('');
      this.model.update(answer.state);
      await this.render();
    } else {
      // No state: nothing to draw (the kernel says why), or the kernel keeps the last drawing.
      this.say(answer.summary || '');
    }
    if (answer.html !== undefined) {
      this.swap(answer.html);
    }
  }

  /** The widget's front end in the host, once: later states reach it through the model.
   * Set before any wait, so that a refresh during a tick does not render it twice. */
  private async render(): Promise<void> {
    if (this.cleanup || !this.rendered) {
      return;
    }
    const rendering = this.rendered.then(render => render({ model: this.model, el: this.host }));
    this.cleanup = rendering;
    try {
      await rendering;
    } catch (e) {
      this.cleanup = null; // the next tick tries again
      throw e;
    }
  }

  /** The widget's CSS, as anywidget adds it for a cell's output. */
  private style(frontEnd: IFrontEnd): void {
    const style = document.createElement('style');
    style.className = 'nbrpc-view-css';
    style.textContent = frontEnd.css;
    this.node.querySelector('style.nbrpc-view-css')?.remove();
    this.node.prepend(style);
  }

  private say(text: string): void {
    this.summary.textContent = text;
    this.summary.hidden = text === '';
  }

  private end(): void {
    this.node.classList.add('nbrpc-ended');
    this.say(
      this.trans.__(
        'the cluster has ended (its kernel runs no nbrpc cluster now); this view no longer refreshes'
      )
    );
    this.poll.dispose();
  }

  /** HTML the kernel sent (the stacks), through the sanitizer. */
  private swap(html: string): void {
    if (html === this.shown) {
      return;
    }
    this.shown = html;
    const template = document.createElement('template');
    template.innerHTML = this.sanitizer.sanitize(html);
    this.host.replaceChildren(template.content);
  }

  readonly model: ViewModel;
  private summary: HTMLElement;
  private host: HTMLElement;
  private shown = '';
  private poll: Poll;
  private rendered: Promise<Render> | null = null;
  private askedWith = '';
  private cleanup: Promise<void | (() => void)> | null = null;
}

/** The choices a request passes to the kernel, as one comparable string. */
function optionsKey(choices: State): string {
  return JSON.stringify(VIEW_OPTIONS.map(name => Boolean(choices[name])));
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

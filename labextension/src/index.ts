// nbrpc's JupyterLab extension: the side panel, its commands, and the views as main-area panels.
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  ISanitizer,
  MainAreaWidget,
  Sanitizer,
  WidgetTracker
} from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ITranslator, nullTranslator, TranslationBundle } from '@jupyterlab/translation';
import { LabIcon } from '@jupyterlab/ui-components';
import { DockLayout } from '@lumino/widgets';

import * as api from './api';
import { CommandIDs } from './commands';
import { ClustersPanel, whereOf } from './panel';
import { VIEWS, viewKind } from './protocol';
import { viewPanel, ViewContent } from './view';

const PLUGIN_ID = 'nbrpc:plugin';

const ICON = new LabIcon({
  name: 'nbrpc:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 16 16"><g class="jp-icon3" fill="#616161">' +
    '<circle cx="3" cy="8" r="2.2"/><circle cx="13" cy="3.5" r="2.2"/><circle cx="13" cy="12.5" r="2.2"/>' +
    '<path d="M4.8 7.2 11.2 4.2l.5 1-6.4 3zM4.8 8.8l6.4 3-.5 1-6.4-3z"/></g></svg>'
});

/** The settings (schema/plugin.json), with their defaults until the registry answers. */
interface ISettings {
  refreshInterval: number;
  notifications: boolean;
  dock: DockLayout.InsertMode;
}

const DEFAULTS: ISettings = { refreshInterval: 1, notifications: true, dock: 'split-right' };

type ViewPanel = MainAreaWidget<ViewContent>;

/** What the commands need: the shell, the panel, the views' tracker, the active notebook. */
interface IContext {
  app: JupyterFrontEnd;
  panel: ClustersPanel;
  tracker: WidgetTracker<ViewPanel>;
  notebooks: INotebookTracker | null;
  labShell: ILabShell | null;
  settings: ISettings;
  trans: TranslationBundle;
  sanitizer: IRenderMime.ISanitizer;
}

/** The kernel a command acts on: its argument, else the active notebook's kernel. */
function kernelOf(ctx: IContext, args: Record<string, unknown>): string {
  const kernelId =
    String(args.kernelId || '') || ctx.notebooks?.currentWidget?.sessionContext.session?.kernel?.id;
  if (!kernelId) {
    throw new Error(ctx.trans.__('no notebook is active: open the notebook of the cluster first'));
  }
  return kernelId;
}

/** Say what an action answered in the panel, and ask the server again. */
async function report(ctx: IContext, action: Promise<string>): Promise<void> {
  try {
    ctx.panel.say(await action);
  } catch (e) {
    ctx.panel.say(String(e instanceof Error ? e.message : e), true);
  }
  await ctx.panel.refresh();
}

function openView(ctx: IContext, args: Record<string, unknown>): ViewPanel {
  const kind = viewKind(String(args.view || ''));
  if (!kind) {
    throw new Error(`no view named ${args.view}; the views are: ${VIEWS.map(v => v.name)}`);
  }
  const kernelId = kernelOf(ctx, args);
  const shown = ctx.tracker.find(w => w.content.kernelId === kernelId && w.content.kind === kind);
  if (shown) {
    ctx.app.shell.activateById(shown.id);
    return shown;
  }
  const known = ctx.panel.clusters.find(c => c.kernel_id === kernelId);
  const where = known ? whereOf(known) : String(args.where || kernelId.slice(0, 8));
  const interval = ctx.settings.refreshInterval * 1000;
  const widget = viewPanel(kernelId, kind, where, ctx.trans, ctx.sanitizer, interval);
  // JupyterLab docks a view beside the notebook; Notebook 7's notebook page has one main
  // widget, so there the view opens in the right side area.
  if (ctx.labShell) {
    ctx.app.shell.add(widget, 'main', { mode: ctx.settings.dock });
  } else {
    ctx.app.shell.add(widget, 'right', { rank: 1000 });
  }
  void ctx.tracker.add(widget);
  ctx.app.shell.activateById(widget.id);
  return widget;
}

function addCommands(ctx: IContext): void {
  const { app, panel, trans } = ctx;
  app.commands.addCommand(CommandIDs.showPanel, {
    label: trans.__('Show the nbrpc panel'),
    execute: () => app.shell.activateById(panel.id)
  });
  app.commands.addCommand(CommandIDs.refresh, {
    label: trans.__('Refresh the nbrpc clusters'),
    execute: () => panel.refresh()
  });
  app.commands.addCommand(CommandIDs.openView, {
    label: args => trans.__(viewKind(String(args.view || ''))?.label || 'nbrpc view'),
    caption: trans.__('Open a view of an nbrpc cluster as a panel'),
    execute: args => openView(ctx, args)
  });
  app.commands.addCommand(CommandIDs.start, {
    label: trans.__('Start an nbrpc cluster in the active notebook'),
    execute: async args => {
      const line = String(args.line || '%rpc_init -n 2');
      await ctx.notebooks?.currentWidget?.sessionContext.ready;
      const kernelId = kernelOf(ctx, args);
      panel.say(trans.__('starting: %1', line));
      await report(
        ctx,
        api.start(kernelId, line).then(r => {
          if (r.error) {
            throw new Error(trans.__('%1 failed: %2', line, r.error));
          }
          return trans.__('ran %1', r.ran.replace(/\n/g, '; '));
        })
      );
    }
  });
  app.commands.addCommand(CommandIDs.shutdown, {
    label: trans.__('Shut down the nbrpc cluster (%rpc_shutdown)'),
    execute: args =>
      report(
        ctx,
        api.shutdown(kernelOf(ctx, args)).then(r => r.summary)
      )
  });
  app.commands.addCommand(CommandIDs.stop, {
    label: trans.__('Stop the stuck call (interrupt the kernel)'),
    execute: args =>
      report(
        ctx,
        api.interrupt(kernelOf(ctx, args)).then(() => trans.__('interrupted the kernel'))
      )
  });
}

function addToPalette(palette: ICommandPalette, trans: TranslationBundle): void {
  const category = 'nbrpc';
  for (const command of [
    CommandIDs.showPanel,
    CommandIDs.refresh,
    CommandIDs.start,
    CommandIDs.shutdown,
    CommandIDs.stop
  ]) {
    palette.addItem({ command, category });
  }
  for (const v of VIEWS) {
    palette.addItem({ command: CommandIDs.openView, args: { view: v.name }, category });
  }
}

function applySettings(ctx: IContext, registry: ISettingRegistry.ISettings): void {
  const read = () => {
    const composite = registry.composite as unknown as Partial<ISettings>;
    Object.assign(ctx.settings, DEFAULTS, composite);
    ctx.panel.interval = ctx.settings.refreshInterval * 1000;
    ctx.panel.notifications = ctx.settings.notifications;
  };
  read();
  registry.changed.connect(read);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Every nbrpc cluster of this server, live; stuck cells; the views as panels.',
  autoStart: true,
  optional: [
    INotebookTracker,
    ICommandPalette,
    ILayoutRestorer,
    ILabShell,
    ISettingRegistry,
    ITranslator,
    ISanitizer
  ],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    labShell: ILabShell | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null,
    sanitizer: IRenderMime.ISanitizer | null
  ) => {
    const trans = (translator ?? nullTranslator).load('nbrpc');
    const settings = { ...DEFAULTS };
    const panel = new ClustersPanel({
      commands: app.commands,
      trans,
      interval: settings.refreshInterval * 1000,
      notifications: settings.notifications
    });
    panel.title.icon = ICON;
    const tracker = new WidgetTracker<ViewPanel>({ namespace: 'nbrpc-views' });
    const ctx: IContext = {
      app,
      panel,
      tracker,
      notebooks,
      labShell,
      settings,
      trans,
      sanitizer: sanitizer ?? new Sanitizer()
    };
    addCommands(ctx);
    // A view's title names its notebook as the panel learns it.
    panel.changed.connect((_, found) => {
      tracker.forEach(w => {
        const c = found.find(c => c.kernel_id === w.content.kernelId);
        if (c) {
          w.title.label = `${trans.__(w.content.kind.label)}: ${whereOf(c)}`;
        }
      });
    });
    app.shell.add(panel, 'left', { rank: 300 });
    if (restorer) {
      restorer.add(panel, 'nbrpc-panel');
      void restorer.restore(tracker, {
        command: CommandIDs.openView,
        args: w => ({ kernelId: w.content.kernelId, view: w.content.kind.name }),
        name: w => `${w.content.kind.name}-${w.content.kernelId}`
      });
    }
    if (palette) {
      addToPalette(palette, trans);
    }
    if (settingRegistry) {
      void settingRegistry
        .load(PLUGIN_ID)
        .then(registry => applySettings(ctx, registry))
        .catch(reason => console.warn('nbrpc: the settings could not be read', reason));
    }
  }
};

export default plugin;

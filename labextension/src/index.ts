// nbrpc's JupyterLab extension: the side panel and the views as main-area panels.
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { ClustersPanel } from './panel';
import { openView, VIEWS } from './view';

const ICON = new LabIcon({
  name: 'nbrpc:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 16 16"><g class="jp-icon3" fill="#616161">' +
    '<circle cx="3" cy="8" r="2.2"/><circle cx="13" cy="3.5" r="2.2"/><circle cx="13" cy="12.5" r="2.2"/>' +
    '<path d="M4.8 7.2 11.2 4.2l.5 1-6.4 3zM4.8 8.8l6.4 3-.5 1-6.4-3z"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbrpc:side-panel',
  description: 'Every nbrpc cluster of this server, live; stuck cells; the views as panels.',
  autoStart: true,
  optional: [INotebookTracker, ICommandPalette, ILayoutRestorer, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    labShell: ILabShell | null
  ) => {
    const open = new Map<string, MainAreaWidget<Widget>>();
    const wheres = new Map<string, string>();

    for (const v of VIEWS) {
      const command = `nbrpc:open-${v.id}`;
      app.commands.addCommand(command, {
        label: v.label,
        caption: `Open the ${v.label} of an nbrpc cluster as a panel`,
        execute: args => {
          const kernelId = String(args.kernelId || '');
          const key = `${v.name}-${kernelId}`;
          const shown = open.get(key);
          if (shown && !shown.isDisposed) {
            app.shell.activateById(shown.id);
            return shown;
          }
          const widget = openView(
            kernelId,
            v.name,
            v.label,
            wheres.get(kernelId) || kernelId.slice(0, 8)
          );
          open.set(key, widget);
          // JupyterLab docks a view beside the notebook; Notebook 7's notebook page has one
          // main widget, so there the view opens in the right side area.
          if (labShell) {
            app.shell.add(widget, 'main', { mode: 'split-right' });
          } else {
            app.shell.add(widget, 'right', { rank: 1000 });
          }
          app.shell.activateById(widget.id);
          return widget;
        }
      });
    }

    const kernelOf = (kernelId: string) => {
      for (const model of app.serviceManager.kernels.running()) {
        if (model.id === kernelId) {
          return app.serviceManager.kernels.connectTo({ model });
        }
      }
      return null;
    };

    app.commands.addCommand('nbrpc:shutdown', {
      label: 'Shut down the nbrpc cluster',
      execute: args => {
        const kernel = kernelOf(String(args.kernelId || ''));
        if (!kernel) {
          return;
        }
        const future = kernel.requestExecute({
          code: '%rpc_shutdown',
          silent: false,
          store_history: false
        });
        // This connection was only for the shutdown: close it once the kernel has run it.
        void future.done.finally(() => kernel.dispose());
      }
    });

    app.commands.addCommand('nbrpc:start', {
      label: 'Start an nbrpc cluster in the active notebook',
      execute: async args => {
        const line = String(args.line || '%rpc_init -n 2');
        const panel = notebooks?.currentWidget;
        if (!panel) {
          throw new Error(
            'no notebook is active: open the notebook the cluster belongs to, then start it'
          );
        }
        await panel.sessionContext.ready;
        const notebook = panel.content;
        NotebookActions.insertBelow(notebook);
        const cell = notebook.activeCell;
        if (cell) {
          cell.model.sharedModel.setSource(`%load_ext nbrpc\n${line}`);
        }
        await NotebookActions.run(notebook, panel.sessionContext);
      }
    });

    const panel = new ClustersPanel({
      open: (kernelId, view) => void app.commands.execute(`nbrpc:open-${view}`, { kernelId }),
      shutdown: kernelId => void app.commands.execute('nbrpc:shutdown', { kernelId }),
      start: line => void app.commands.execute('nbrpc:start', { line })
    });
    panel.title.icon = ICON;
    panel.onWhere = (kernelId, where) => wheres.set(kernelId, where);
    app.shell.add(panel, 'left', { rank: 300 });
    restorer?.add(panel, 'nbrpc-panel');
    palette?.addItem({ command: 'nbrpc:start', category: 'nbrpc' });
  }
};

export default plugin;

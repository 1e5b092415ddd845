// The names the panel shares with the Jupyter server and the driver kernel. The Python side
// writes them once in nbrpc_server/protocol.py; a test reads these lists against it.

/** A view a kernel draws: command id suffix, label (what the command opens), request name;
 * ``html``: the kernel sends it as HTML (no widget shows it); ``htmlTrait``: the trait of its
 * widget's state that holds HTML. Both go through JupyterLab's sanitizer. */
export interface IViewKind {
  id: string;
  label: string;
  name: string;
  html?: boolean;
  htmlTrait?: string;
}

/** The views (nbrpc_server.protocol.VIEWS, by name). */
export const VIEWS: IViewKind[] = [
  { id: 'rref-graph', label: 'RRef graph', name: 'rref' },
  { id: 'timeline', label: 'Timeline', name: 'timeline', htmlTrait: 'table' },
  { id: 'waits-graph', label: 'Wait-for graph', name: 'waits' },
  { id: 'autograd-graph', label: 'Autograd graph', name: 'autograd' },
  { id: 'status', label: 'Status', name: 'status', htmlTrait: 'html' },
  { id: 'stacks', label: 'Stacks', name: 'stacks', html: true }
];

/** The front end's choices a view's request passes to the kernel, which draws them
 * (nbrpc_server.protocol.VIEW_OPTIONS). */
export const VIEW_OPTIONS = ['show_forks'];

/** The keys of a member's row (nbrpc_server.protocol.MEMBER_COLUMNS). */
export const MEMBER_COLUMNS = [
  'name',
  'rank',
  'host',
  'pid',
  'state',
  'devices',
  'busy',
  'owned_rrefs'
] as const;

/** The view of a request name or a command id suffix, if there is one. */
export function viewKind(nameOrId: string): IViewKind | undefined {
  return VIEWS.find(v => v.name === nameOrId || v.id === nameOrId);
}

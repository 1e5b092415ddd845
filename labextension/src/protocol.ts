// The names the panel shares with the Jupyter server and the driver kernel. The Python side
// writes them once in nbrpc_server/protocol.py; a test reads these lists against it.

/** A view a kernel draws: command id suffix, label (what the command opens), request name,
 * and whether it is HTML (a table, text) rather than nbrpc's own SVG drawing. */
export interface IViewKind {
  id: string;
  label: string;
  name: string;
  html?: boolean;
}

/** The views (nbrpc_server.protocol.VIEWS, by name). */
export const VIEWS: IViewKind[] = [
  { id: 'rref-graph', label: 'RRef graph', name: 'rref' },
  { id: 'timeline', label: 'Timeline', name: 'timeline' },
  { id: 'waits-graph', label: 'Wait-for graph', name: 'waits' },
  { id: 'autograd-graph', label: 'Autograd graph', name: 'autograd' },
  { id: 'status', label: 'Status', name: 'status', html: true },
  { id: 'stacks', label: 'Stacks', name: 'stacks', html: true }
];

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

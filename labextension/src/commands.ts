// The extension's command ids, written once.

export namespace CommandIDs {
  /** Show the side panel. */
  export const showPanel = 'nbrpc:show-panel';
  /** Ask the server again now. */
  export const refresh = 'nbrpc:refresh';
  /** Run a %rpc_init line (args.line) in a kernel (args.kernelId, else the active notebook's). */
  export const start = 'nbrpc:start';
  /** %rpc_shutdown in a cluster's kernel (args.kernelId, else the active notebook's). */
  export const shutdown = 'nbrpc:shutdown';
  /** Stop the stuck call: interrupt the cluster's kernel. */
  export const stop = 'nbrpc:stop';
  /** Open a view (args.view: its name or id) of a cluster (args.kernelId) as a panel. */
  export const openView = 'nbrpc:open-view';
}

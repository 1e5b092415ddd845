// The side panel's requests to nbrpc's server extension (<base_url>/nbrpc/...): every action
// the panel takes goes through these endpoints, each what a magic in the notebook would do.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IFrontEnd } from './frontend';
import type { State } from './model';
import { VIEW_OPTIONS } from './protocol';

/** One member of a cluster: a row of %rpc_status. */
export interface IMember {
  name: string;
  rank: number;
  host: string;
  pid: number;
  state: string;
  devices: string | null;
  busy: number | null;
  owned_rrefs: number | null;
}

/** A finding of nbrpc.waits(), in brief. */
export interface IFinding {
  kind: string;
  members: string[];
  message: string;
}

/** One cluster of one of this server's kernels. */
export interface ICluster {
  kernel_id: string;
  path: string | null;
  type: string | null;
  name: string | null;
  error?: string;
  cluster?: {
    driver: string;
    state: string;
    trace: boolean;
    members: IMember[];
    waiting: boolean;
    calls: number;
    findings: IFinding[];
    autograd: boolean;
  } | null;
}

/** A view drawn by the kernel: the state its widget's traits would hold (and, when asked for,
 * that widget's ES module and CSS), or HTML (the stacks). */
export interface IView {
  ended?: boolean;
  state?: State;
  front_end?: IFrontEnd;
  html?: string;
  summary?: string;
  error?: string;
}

const settings = ServerConnection.makeSettings();

async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'nbrpc', path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  if (!response.ok) {
    let message = text;
    try {
      message = JSON.parse(text).message || text;
    } catch {
      // not JSON: the text is the message
    }
    throw new ServerConnection.ResponseError(response, message);
  }
  return JSON.parse(text) as T;
}

/** Every nbrpc cluster of this server's kernels. */
export async function clusters(members: boolean): Promise<ICluster[]> {
  const reply = await request<{ clusters: ICluster[] }>(
    members ? 'clusters' : 'clusters?members=0'
  );
  return reply.clusters;
}

/** One view of a kernel's cluster; with ``frontEnd``, its widget's front end too; ``options``:
 * the front end's choices the kernel draws (VIEW_OPTIONS). */
export function view(
  kernelId: string,
  name: string,
  frontEnd: boolean,
  options: State = {}
): Promise<IView> {
  const query: Record<string, string> = frontEnd ? { front_end: '1' } : {};
  for (const option of VIEW_OPTIONS) {
    if (options[option]) {
      query[option] = '1';
    }
  }
  const path = URLExt.join('clusters', kernelId, 'views', name);
  return request<IView>(path + URLExt.objectToQueryString(query));
}

/** What a start ran in the kernel (the %rpc_init line as a cell), and how it ended. */
export interface IStarted {
  ran: string;
  status: string;
  error?: string;
}

/** Start a cluster: the kernel runs the form's %rpc_init line as a cell would. */
export function start(kernelId: string, line: string): Promise<IStarted> {
  return request<IStarted>(URLExt.join('clusters', kernelId, 'start'), {
    method: 'POST',
    body: JSON.stringify({ line })
  });
}

/** %rpc_shutdown in the cluster's kernel, on its control channel (it works while a cell is stuck). */
export function shutdown(kernelId: string): Promise<{ shut_down: boolean; summary: string }> {
  return request(URLExt.join('clusters', kernelId, 'shutdown'), { method: 'POST' });
}

/** Stop the stuck call: interrupt the cluster's kernel, as the notebook's stop button does. */
export function interrupt(kernelId: string): Promise<unknown> {
  return request(URLExt.join('clusters', kernelId, 'interrupt'), { method: 'POST' });
}

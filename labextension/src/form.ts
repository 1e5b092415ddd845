// The form that starts a cluster: it writes the %rpc_init line the kernel runs.
import type { TranslationBundle } from '@jupyterlab/translation';

function field(form: HTMLElement, label: string, input: HTMLElement): void {
  const row = document.createElement('label');
  row.className = 'nbrpc-field';
  row.append(label, input);
  form.append(row);
}

function input(name: string, placeholder: string, type = 'text'): HTMLInputElement {
  const node = document.createElement('input');
  node.name = name;
  node.type = type;
  node.placeholder = placeholder;
  node.className = 'jp-mod-styled';
  return node;
}

/** The %rpc_init line of the form's values: what a user would type in the notebook. */
export function initLine(values: Record<string, string | boolean>): string {
  const parts = ['%rpc_init'];
  const names = String(values.names || '').trim();
  if (names) {
    parts.push('--names', names.replace(/\s+/g, ''));
  } else {
    parts.push('-n', String(values.workers || '2').trim() || '2');
  }
  if (values.where === 'ssh' && String(values.hosts || '').trim()) {
    parts.push('--hosts', String(values.hosts).replace(/\s+/g, ''));
  }
  if (values.where === 'slurm') {
    parts.push('--slurm');
    const extra = String(values.slurm || '').trim();
    if (extra) {
      parts.push('--slurm-args', JSON.stringify(extra));
    }
  }
  for (const option of ['threads', 'timeout']) {
    const value = String(values[option] || '').trim();
    if (value) {
      parts.push(`--${option}`, value);
    }
  }
  if (values.trace) {
    parts.push('--trace');
  }
  return parts.join(' ');
}

function where(trans: TranslationBundle): HTMLSelectElement {
  const select = document.createElement('select');
  select.name = 'where';
  select.className = 'jp-mod-styled';
  for (const [value, text] of [
    ['local', trans.__('this machine')],
    ['ssh', trans.__('SSH hosts')],
    ['slurm', trans.__('Slurm')]
  ]) {
    const option = document.createElement('option');
    option.value = value;
    option.textContent = text;
    select.append(option);
  }
  return select;
}

/** The form's values by input name. */
function valuesOf(form: HTMLFormElement): Record<string, string | boolean> {
  const values: Record<string, string | boolean> = {};
  for (const node of Array.from(form.querySelectorAll('input,select'))) {
    const item = node as HTMLInputElement;
    values[item.name] = item.type === 'checkbox' ? item.checked : item.value;
  }
  return values;
}

/** The start form; ``start`` gets the %rpc_init line. */
export function startForm(trans: TranslationBundle, start: (line: string) => void): HTMLElement {
  const form = document.createElement('form');
  form.className = 'nbrpc-start';
  const title = document.createElement('h3');
  title.textContent = trans.__('Start a cluster in the active notebook');
  form.append(title);
  const workers = input('workers', '2', 'number');
  workers.min = '1';
  field(form, trans.__('workers'), workers);
  field(form, trans.__('or names'), input('names', 'ps,trainer1,trainer2'));
  field(form, trans.__('where'), where(trans));
  field(form, trans.__('SSH hosts'), input('hosts', 'hostA,hostB:2'));
  field(form, trans.__('Slurm options'), input('slurm', '-p gpu -t 30'));
  field(form, trans.__('threads'), input('threads', '16', 'number'));
  field(form, trans.__('timeout (s)'), input('timeout', '60', 'number'));
  field(form, trans.__('record calls (trace)'), input('trace', '', 'checkbox'));
  const go = document.createElement('button');
  go.type = 'submit';
  go.className = 'jp-Button jp-mod-styled jp-mod-accept nbrpc-start-button';
  go.textContent = trans.__('Start');
  form.append(go);
  form.addEventListener('submit', event => {
    event.preventDefault();
    start(initLine(valuesOf(form)));
  });
  return form;
}

// The form that starts a cluster: it writes the %rpc_init line the notebook runs.
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

/** The %rpc_init line of the form's values (exported for the tests' sake). */
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

/** The start form; ``start`` gets the %rpc_init line. */
export function startForm(start: (line: string) => void): HTMLElement {
  const form = document.createElement('form');
  form.className = 'nbrpc-start';
  const title = document.createElement('h3');
  title.textContent = 'Start a cluster in the active notebook';
  form.append(title);
  const workers = input('workers', '2', 'number');
  workers.min = '1';
  field(form, 'workers', workers);
  field(form, 'or names', input('names', 'ps,trainer1,trainer2'));
  const where = document.createElement('select');
  where.name = 'where';
  where.className = 'jp-mod-styled';
  for (const [value, text] of [
    ['local', 'this machine'],
    ['ssh', 'SSH hosts'],
    ['slurm', 'Slurm']
  ]) {
    const option = document.createElement('option');
    option.value = value;
    option.textContent = text;
    where.append(option);
  }
  field(form, 'where', where);
  field(form, 'SSH hosts', input('hosts', 'hostA,hostB:2'));
  field(form, 'Slurm options', input('slurm', '-p gpu -t 30'));
  field(form, 'threads', input('threads', '16', 'number'));
  field(form, 'timeout (s)', input('timeout', '60', 'number'));
  const trace = input('trace', '', 'checkbox');
  field(form, 'record calls (trace)', trace);
  const go = document.createElement('button');
  go.type = 'submit';
  go.className = 'jp-Button jp-mod-styled jp-mod-accept nbrpc-start-button';
  go.textContent = 'Start';
  form.append(go);
  form.addEventListener('submit', event => {
    event.preventDefault();
    const values: Record<string, string | boolean> = {};
    for (const node of Array.from(form.querySelectorAll('input,select'))) {
      const item = node as HTMLInputElement;
      values[item.name] = item.type === 'checkbox' ? item.checked : item.value;
    }
    start(initLine(values));
  });
  return form;
}

// The start form's %rpc_init line: what a user would type for each choice of the form.
import { initLine } from '../form';

describe('initLine', () => {
  it('starts two workers by default', () => {
    expect(initLine({})).toBe('%rpc_init -n 2');
  });

  it('takes the number of workers, the threads, the timeout and the trace', () => {
    expect(initLine({ workers: '3', threads: '8', timeout: '30', trace: true })).toBe(
      '%rpc_init -n 3 --threads 8 --timeout 30 --trace'
    );
  });

  it('names the workers instead of counting them, without spaces', () => {
    expect(initLine({ workers: '3', names: 'ps, trainer1 ,trainer2' })).toBe(
      '%rpc_init --names ps,trainer1,trainer2'
    );
  });

  it('passes SSH hosts only where the workers run over SSH', () => {
    expect(initLine({ where: 'ssh', hosts: 'hostA, hostB:2' })).toBe(
      '%rpc_init -n 2 --hosts hostA,hostB:2'
    );
    expect(initLine({ where: 'local', hosts: 'hostA' })).toBe('%rpc_init -n 2');
  });

  it("quotes Slurm's options as one argument", () => {
    expect(initLine({ where: 'slurm', slurm: '-p gpu -t 30' })).toBe(
      '%rpc_init -n 2 --slurm --slurm-args "-p gpu -t 30"'
    );
    expect(initLine({ where: 'slurm' })).toBe('%rpc_init -n 2 --slurm');
  });

  it('leaves out what is blank and the trace when unchecked', () => {
    expect(initLine({ workers: ' ', threads: '  ', timeout: '', trace: false })).toBe(
      '%rpc_init -n 2'
    );
  });
});

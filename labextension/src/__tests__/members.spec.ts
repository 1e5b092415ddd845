// The member table: the rows of %rpc_status as the panel shows them.
import type { IMember } from '../api';
import { cellText, memberTable } from '../members';

const member = (over: Partial<IMember>): IMember => ({
  name: 'worker1',
  rank: 1,
  host: 'h',
  pid: 11,
  state: 'running',
  devices: null,
  busy: null,
  owned_rrefs: null,
  ...over
});

describe('memberTable', () => {
  it('has a heading per shown column, the RRefs named for people', () => {
    expect(memberTable([]).headings).toEqual([
      'name',
      'host',
      'pid',
      'state',
      'devices',
      'busy',
      'RRefs'
    ]);
  });

  it('has one row per member in rank order, unknown values as a dash', () => {
    const rows = [
      member({ name: 'worker2', rank: 2, pid: 12, busy: 0, owned_rrefs: 3, devices: 'cpu' }),
      member({ name: 'master', rank: 0, pid: 10, state: 'driver' })
    ];
    expect(memberTable(rows).rows).toEqual([
      ['master', 'h', '10', 'driver', '-', '-', '-'],
      ['worker2', 'h', '12', 'running', 'cpu', '0', '3']
    ]);
  });
});

describe('cellText', () => {
  it('shows zero and false, and a dash for nothing', () => {
    expect([0, false, null, undefined, ''].map(cellText)).toEqual(['0', 'false', '-', '-', '-']);
  });
});

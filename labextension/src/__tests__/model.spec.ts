// The model a docked view hands the widgets' ES modules: the kernel's state in, the front
// end's choices kept and passed on.
import { ViewModel } from '../model';

describe('ViewModel', () => {
  it('has every new value in place before any listener runs', () => {
    const model = new ViewModel();
    const seen: unknown[] = [];
    model.on('change:svg', () => seen.push([model.get('svg'), model.get('details')]));
    expect(model.update({ svg: '<svg/>', details: { a: 1 } })).toEqual(['svg', 'details']);
    expect(seen).toEqual([['<svg/>', { a: 1 }]]);
  });

  it('tells listeners of changed values only, and stops after off', () => {
    const model = new ViewModel();
    let calls = 0;
    const count = () => calls++;
    model.on('change:status', count);
    model.update({ status: 'one', details: { a: [1, 2] } });
    expect(model.update({ status: 'one', details: { a: [1, 2] } })).toEqual([]);
    model.update({ status: 'two' });
    model.off('change:status', count);
    model.update({ status: 'three' });
    expect(calls).toBe(2);
    expect(model.get('status')).toBe('three');
  });

  it("keeps the front end's choices over the kernel's and says them when saved", () => {
    const model = new ViewModel();
    const saved: unknown[] = [];
    model.saved.connect((_, choices) => saved.push(choices));
    model.update({ selected: '', show_forks: false });
    model.set('selected', '0:1');
    model.set('show_forks', true);
    model.save_changes();
    model.update({ selected: '', show_forks: false, svg: 'x' });
    expect([model.get('selected'), model.get('show_forks'), model.get('svg')]).toEqual([
      '0:1',
      true,
      'x'
    ]);
    expect(saved).toEqual([{ selected: '0:1', show_forks: true }]);
  });

  it('prepares what the kernel sends (HTML through the sanitizer) but not the choices', () => {
    const model = new ViewModel((name, value) => (name === 'html' ? `clean:${value}` : value));
    model.update({ html: '<b>x</b>', svg: '<svg/>' });
    expect([model.get('html'), model.get('svg')]).toEqual(['clean:<b>x</b>', '<svg/>']);
  });
});

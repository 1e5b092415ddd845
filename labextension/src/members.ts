// The member table's text: pure, so that it is tested without a page.
import type { IMember } from './api';
import { MEMBER_COLUMNS } from './protocol';

/** The columns the panel shows (the rank is in the name's order), with their headings. */
export const SHOWN: { key: (typeof MEMBER_COLUMNS)[number]; heading: string }[] = [
  { key: 'name', heading: 'name' },
  { key: 'host', heading: 'host' },
  { key: 'pid', heading: 'pid' },
  { key: 'state', heading: 'state' },
  { key: 'devices', heading: 'devices' },
  { key: 'busy', heading: 'busy' },
  { key: 'owned_rrefs', heading: 'RRefs' }
];

/** A cell's text: what the member said, or "-" where it said nothing (not asked, or none). */
export function cellText(value: unknown): string {
  return value === null || value === undefined || value === '' ? '-' : String(value);
}

/** The table as text: headings, then one row per member in rank order. */
export function memberTable(rows: IMember[]): { headings: string[]; rows: string[][] } {
  const ranked = [...rows].sort((a, b) => a.rank - b.rank);
  return {
    headings: SHOWN.map(c => c.heading),
    rows: ranked.map(row => SHOWN.map(c => cellText(row[c.key])))
  };
}

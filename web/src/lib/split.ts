// An alias split between versions by weight (a canary rollout; PUT /v1/adapters/{name}/aliases/{alias}
// with `split`): the editor's rows, what the server would refuse (said before Save, with the row), and
// each version's share as the percentages a person reads.

export interface Share {
  version: number;
  weight: number;
}

/** One editor row: the weight as typed. */
export interface ShareRow {
  version: number;
  weight: string;
}

/** The server's bounds (platform/registry/splits.py): 2 to 16 distinct versions, whole weights >= 1. */
export const MIN_VERSIONS = 2;

/** Why the rows cannot be saved, naming the row; null when they can. */
export function splitProblem(rows: ShareRow[]): string | null {
  if (rows.length < MIN_VERSIONS) return `A split needs ${MIN_VERSIONS} versions or more; add a version.`;
  const seen = new Set<number>();
  for (const [index, row] of rows.entries()) {
    if (seen.has(row.version)) return `Row ${index + 1}: v${row.version} is already in the split; choose another version.`;
    seen.add(row.version);
    const weight = Number(row.weight);
    if (row.weight.trim() === "" || !Number.isInteger(weight) || weight < 1) {
      return `Row ${index + 1}: the weight must be a whole number of 1 or more.`;
    }
  }
  return null;
}

export function sharesOf(rows: ShareRow[]): Share[] {
  return rows.map((row) => ({ version: row.version, weight: Number(row.weight) }));
}

/** Each version's share of the requests, in percent (weight / total weight). */
export function percentages(shares: Share[]): { version: number; percent: number }[] {
  const total = shares.reduce((sum, share) => sum + share.weight, 0);
  return shares.map((share) => ({ version: share.version, percent: total > 0 ? (100 * share.weight) / total : 0 }));
}

const percentFormat = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });

/** "v3 90% · v4 10%", in version order. */
export function formatSplit(shares: Share[]): string {
  return percentages([...shares].sort((a, b) => a.version - b.version))
    .map((share) => `v${share.version} ${percentFormat.format(share.percent)}%`)
    .join(" · ");
}

/** The canary: the split's newest version, which the server's promote picks by default. */
export function canaryOf(shares: Share[]): number {
  return Math.max(...shares.map((share) => share.version));
}

/** Where the editor starts: the alias's split, or its version at 90 and the newest other version at 10. */
export function startingRows(current: { version: number; split?: Share[] | null }, versions: number[]): ShareRow[] {
  if (current.split && current.split.length > 0) {
    return current.split.map((share) => ({ version: share.version, weight: String(share.weight) }));
  }
  const other = [...versions].sort((a, b) => b - a).find((version) => version !== current.version);
  const rows = [{ version: current.version, weight: "90" }];
  return other === undefined ? rows : [...rows, { version: other, weight: "10" }];
}

/** An alias's change as its history lists it (oldest first). */
export interface AliasChange {
  action: string;
  to_version: number | null;
  changed_at: string;
}

/** The current split's changes: the run of `split` changes at the end of the history (a weight change is one). */
function currentSplitRun<C extends AliasChange>(history: C[]): C[] {
  let start = history.length;
  while (start > 0 && history[start - 1].action === "split") start -= 1;
  return history.slice(start);
}

/** Where a rollback goes, as the server picks it: the version the alias named alone before the split;
 * null when it was created split (the server refuses that rollback). */
export function versionBeforeSplit(history: AliasChange[]): number | null {
  const run = currentSplitRun(history);
  if (run.length === 0) return null;
  const before = history[history.length - run.length - 1];
  return before ? before.to_version : null;
}

/** When the current split began: its figures are counted from then. */
export function splitStartedAt(history: AliasChange[]): string | null {
  return currentSplitRun(history)[0]?.changed_at ?? null;
}

// Where an adapter's weights are now, for display: the best place any of its versions holds.
import type { Residency } from "../api/queries";

export type Place = "GPU slot" | "host cache" | "storage only";

export function placeOf(name: string, resident: Residency[] | undefined): Place {
  const mine = (resident ?? []).filter((entry) => entry.adapter === name);
  if (mine.some((entry) => entry.location === "gpu")) return "GPU slot";
  if (mine.length > 0) return "host cache";
  return "storage only";
}

/** Sum of each adapter's requests and tokens over the points given (one adapter name per point). */
export function totalsByAdapter(points: { adapter: string | null; requests: number; total_tokens: number }[]) {
  const totals = new Map<string, { requests: number; tokens: number }>();
  for (const point of points) {
    const name = point.adapter ?? "base";
    const entry = totals.get(name) ?? { requests: 0, tokens: 0 };
    entry.requests += point.requests;
    entry.tokens += point.total_tokens;
    totals.set(name, entry);
  }
  return totals;
}

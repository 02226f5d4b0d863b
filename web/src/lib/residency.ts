// Where an adapter's weights are now, for display: the best place any of its versions holds. The
// engine's adapter slots are in GPU memory on a GPU server and in host memory on a CPU one, so the
// words follow the device the engine status reports.
import type { Residency } from "../api/types";

/** "GPU slot" on a GPU, "CPU slot" on a CPU: what an engine adapter slot is on `device` ("cuda:0", "cpu"). */
export function slotName(device: string | undefined): string {
  return device?.startsWith("cuda") ? "GPU slot" : "CPU slot";
}

export function placeOf(name: string, resident: Residency[] | undefined, device: string | undefined): string {
  const mine = (resident ?? []).filter((entry) => entry.adapter === name);
  if (mine.some((entry) => entry.location === "gpu")) return slotName(device);
  if (mine.length > 0) return "host cache";
  return "storage only";
}

/** Slot -> the references in it, for slots holding more than one: versions (or adapters, or checkpoints)
 * whose weights are byte-identical have one runtime key and share one slot. */
export function sharedSlots(resident: Residency[]): Map<number, string[]> {
  const bySlot = new Map<number, string[]>();
  for (const entry of resident) {
    if (entry.slot === null) continue;
    bySlot.set(entry.slot, [...(bySlot.get(entry.slot) ?? []), entry.reference]);
  }
  return new Map([...bySlot].filter(([, references]) => references.length > 1));
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

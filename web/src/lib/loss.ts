// A job's curves from its "metrics" events (one per optimizer step), in OpenAI's metric names:
// train_loss every step, valid_loss on evaluation steps, full_valid_loss on the final step, and the
// token accuracies (or DPO's reward accuracies) beside them. Jobs trained before those names reported
// their validation loss as `eval_loss`: it stands in for valid_loss when that is missing.
import type { JobEvent } from "../api/types";

export interface MetricSpec {
  name: string;
  label: string;
  color: string;
  /** Read when `name` is absent: an older job's spelling of the same figure. */
  fallback?: string;
  /** Sparse (evaluation steps only): drawn as marked points. */
  points?: boolean;
}

export const LOSS_METRICS: MetricSpec[] = [
  { name: "train_loss", label: "train loss", color: "#2563eb" },
  { name: "valid_loss", label: "validation loss", color: "#dc2626", fallback: "eval_loss", points: true },
  { name: "full_valid_loss", label: "full validation loss", color: "#7c3aed", points: true },
];

export const ACCURACY_METRICS: MetricSpec[] = [
  { name: "train_mean_token_accuracy", label: "train token accuracy", color: "#059669" },
  { name: "valid_mean_token_accuracy", label: "validation token accuracy", color: "#d97706", points: true },
  { name: "full_valid_mean_token_accuracy", label: "full validation token accuracy", color: "#7c3aed", points: true },
  // DPO: the share of pairs whose preferred answer gained more than the other.
  { name: "train_reward_accuracy", label: "train reward accuracy", color: "#0891b2" },
  { name: "valid_reward_accuracy", label: "validation reward accuracy", color: "#be185d", points: true },
];

export interface Curves {
  steps: number[];
  /** Per metric name, one value (or null) per step of `steps`. */
  values: Record<string, (number | null)[]>;
}

export interface ChartSeries {
  label: string;
  color: string;
  values: (number | null)[];
  points?: boolean;
}

function numberAt(data: Record<string, unknown>, spec: MetricSpec): number | null {
  const value = data[spec.name] ?? (spec.fallback ? data[spec.fallback] : undefined);
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

/** Steps in order, each once: a resumed or retried run reports steps again, and its latest report wins. */
export function metricCurves(events: JobEvent[], specs: MetricSpec[] = [...LOSS_METRICS, ...ACCURACY_METRICS]): Curves {
  const byStep = new Map<number, Record<string, number | null>>();
  // Stable: events of one second keep the server's order (ascending ids).
  const ordered = [...events].sort((a, b) => a.created_at - b.created_at);
  for (const event of ordered) {
    const data = event.data;
    if (event.type !== "metrics" || !data || typeof data.step !== "number") continue;
    byStep.set(data.step, Object.fromEntries(specs.map((spec) => [spec.name, numberAt(data, spec)])));
  }
  const steps = [...byStep.keys()].sort((a, b) => a - b);
  const values = Object.fromEntries(specs.map((spec) => [spec.name, steps.map((step) => byStep.get(step)![spec.name])]));
  return { steps, values };
}

/** The chart's series: those of `specs` with at least one value (a supervised job has no reward accuracy). */
export function presentSeries(curves: Curves, specs: MetricSpec[]): ChartSeries[] {
  return specs
    .filter((spec) => curves.values[spec.name]?.some((value) => value !== null))
    .map((spec) => ({ label: spec.label, color: spec.color, values: curves.values[spec.name], points: spec.points }));
}

/** How many steps have a validation loss. */
export function evaluatedSteps(curves: Curves): number {
  return (curves.values.valid_loss ?? []).filter((value) => value !== null).length;
}

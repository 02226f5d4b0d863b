// The loss curve of a job from its "metrics" events (one per optimizer step).
import type { JobEvent } from "../api/types";

export interface LossCurve {
  steps: number[];
  train: (number | null)[];
  eval: (number | null)[];
}

/** Steps in order, each once: a retried run reports steps again, and its latest report wins. */
export function lossCurve(events: JobEvent[]): LossCurve {
  const byStep = new Map<number, { train: number | null; eval: number | null }>();
  const ordered = [...events].sort((a, b) => a.created_at - b.created_at);
  for (const event of ordered) {
    const data = event.data;
    if (event.type !== "metrics" || !data || typeof data.step !== "number") continue;
    byStep.set(data.step, {
      train: typeof data.train_loss === "number" ? data.train_loss : null,
      eval: typeof data.eval_loss === "number" ? data.eval_loss : null,
    });
  }
  const steps = [...byStep.keys()].sort((a, b) => a - b);
  return {
    steps,
    train: steps.map((step) => byStep.get(step)!.train),
    eval: steps.map((step) => byStep.get(step)!.eval),
  };
}

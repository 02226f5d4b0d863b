// A training job's progress from its last reported step (Job.metrics, written by the worker after
// every optimizer step): how far, how fast, how long to go.
import type { Job } from "../api/types";

export interface Progress {
  step: number;
  totalSteps: number;
  fraction: number; // 0..1
  etaSeconds: number | null; // null once the job is no longer running
  tokensPerSecond: number | null;
}

const RUNNING = ["validating_files", "queued", "running", "cancel_requested", "pause_requested"];

function numberField(metrics: Record<string, unknown>, name: string): number | null {
  const value = metrics[name];
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

/** null until the job has reported a step. */
export function jobProgress(job: Pick<Job, "status" | "metrics">): Progress | null {
  const metrics = job.metrics ?? {};
  const step = numberField(metrics, "step");
  const totalSteps = numberField(metrics, "total_steps");
  if (step === null || totalSteps === null || totalSteps <= 0) return null;
  const running = RUNNING.includes(job.status);
  return {
    step,
    totalSteps,
    fraction: Math.min(1, step / totalSteps),
    etaSeconds: running ? numberField(metrics, "eta_seconds") : null,
    tokensPerSecond: numberField(metrics, "tokens_per_second"),
  };
}

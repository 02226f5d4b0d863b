// A job's checkpoints, each with its step's losses, a link to chat with it in the playground (its id
// is a model reference) and one to start a new job from its weights (the job form, filled from this job).
import { Link } from "react-router-dom";
import type { Checkpoint } from "../api/types";

const loss = new Intl.NumberFormat(undefined, { maximumFractionDigits: 4 });

function figure(metrics: Record<string, unknown>, ...names: string[]): string | null {
  for (const name of names) {
    const value = metrics[name];
    if (typeof value === "number" && Number.isFinite(value)) return loss.format(value);
  }
  return null;
}

export function CheckpointList({ checkpoints, jobId }: { checkpoints: Checkpoint[]; jobId: string }) {
  return (
    <ul aria-label="Checkpoints" className="checkpoints">
      {checkpoints.map((checkpoint) => {
        const train = figure(checkpoint.metrics, "train_loss");
        const valid = figure(checkpoint.metrics, "valid_loss", "eval_loss");
        const id = checkpoint.fine_tuned_model_checkpoint;
        const from = new URLSearchParams({ from_job: jobId, from_checkpoint: id });
        return (
          <li key={checkpoint.id} data-step={checkpoint.step_number}>
            step {checkpoint.step_number}: <code>{id}</code>
            {train !== null && <> · train loss {train}</>}
            {valid !== null && <> · validation loss {valid}</>}{" "}
            · <Link to={`/playground?model=${encodeURIComponent(id)}`}>chat with this checkpoint</Link>{" "}
            · <Link to={`/training?${from}`}>start a job from here</Link>
          </li>
        );
      })}
    </ul>
  );
}

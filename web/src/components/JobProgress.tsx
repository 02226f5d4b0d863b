// A job's progress: a compact cell for the jobs list, and the facts on the job's page.
import type { Job } from "../api/types";
import { formatNumber } from "../lib/format";
import { formatSeconds } from "../lib/latency";
import { jobProgress } from "../lib/progress";

const tokensPerSecond = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });

export function ProgressCell({ job }: { job: Job }) {
  const progress = jobProgress(job);
  if (progress === null) return <>—</>;
  return (
    <span className="progress-cell" data-testid="job-progress">
      <progress max={progress.totalSteps} value={progress.step} aria-label={`Step ${progress.step} of ${progress.totalSteps}`} />{" "}
      {progress.step}/{progress.totalSteps}
      {progress.etaSeconds !== null && <> · ETA {formatSeconds(progress.etaSeconds)}</>}
      {progress.tokensPerSecond !== null && <> · {tokensPerSecond.format(progress.tokensPerSecond)} tok/s</>}
    </span>
  );
}

export function ProgressFacts({ job }: { job: Job }) {
  const progress = jobProgress(job);
  if (progress === null) return null;
  return (
    <>
      <dt>Progress</dt>
      <dd data-testid="job-step">step {formatNumber(progress.step)} of {formatNumber(progress.totalSteps)}</dd>
      {progress.etaSeconds !== null && (
        <>
          <dt>Time left</dt>
          <dd>{formatSeconds(progress.etaSeconds)}</dd>
        </>
      )}
      {progress.tokensPerSecond !== null && (
        <>
          <dt>Speed</dt>
          <dd>{tokensPerSecond.format(progress.tokensPerSecond)} tokens/s</dd>
        </>
      )}
    </>
  );
}

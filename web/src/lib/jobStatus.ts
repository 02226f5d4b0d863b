// What a job's status allows, as the server's lifecycle has it (platform/training/lifecycle.py and
// jobs.py): the console offers a button only where the server would accept its call.

/** No worker holds the job and nothing changes until someone acts: the page stops polling. */
export const RESTING = ["succeeded", "failed", "cancelled", "paused"];

/** Pause: a job not yet running is paused at once; a running one after its current step. */
export function canPause(status: string): boolean {
  return ["validating_files", "queued", "running"].includes(status);
}

/** Resume: back to queued, continuing from the job's last checkpoint. */
export function canResume(status: string): boolean {
  return ["paused", "failed", "cancelled"].includes(status);
}

/** Cancel: anything not ended (a paused job too), unless a cancel is already on its way. */
export function canCancel(status: string): boolean {
  return ["validating_files", "queued", "running", "paused", "pause_requested"].includes(status);
}

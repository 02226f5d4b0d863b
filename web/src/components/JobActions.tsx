// A job's Pause, Resume and Cancel buttons, each shown only where the server would take it: pause while
// it waits or runs (a running job stops after its step and saves a checkpoint), resume a paused, failed
// or cancelled job (from its last checkpoint), cancel anything not ended.
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { Job } from "../api/types";
import { canCancel, canPause, canResume } from "../lib/jobStatus";
import { useApi } from "../session";
import { ConfirmButton } from "./Confirm";

type Action = "pause" | "resume" | "cancel";

/** The call behind the buttons; its error is shown by the page, below the title. */
export function useJobAction(jobId: string) {
  const api = useApi();
  const client = useQueryClient();
  return useMutation({
    mutationFn: (action: Action) => {
      const params = { params: { path: { job_id: jobId } } };
      if (action === "pause") return ok(api.http.POST("/v1/fine_tuning/jobs/{job_id}/pause", params));
      if (action === "resume") return ok(api.http.POST("/v1/fine_tuning/jobs/{job_id}/resume", params));
      return ok(api.http.POST("/v1/fine_tuning/jobs/{job_id}/cancel", params));
    },
    onSuccess: (updated) => {
      client.setQueryData(queryKeys.jobs.one(jobId), updated);
      return client.invalidateQueries({ queryKey: queryKeys.jobs.all });
    },
  });
}

export function JobActions({ job, act }: { job: Job; act: ReturnType<typeof useJobAction> }) {
  const busy = act.isPending;
  return (
    <span className="push-right actions" role="group" aria-label="Job actions">
      {canPause(job.status) && (
        <button type="button" disabled={busy} onClick={() => act.mutate("pause")}
          title="A running job stops after its current step and keeps a checkpoint to resume from">Pause</button>
      )}
      {canResume(job.status) && (
        <button type="button" className="primary" disabled={busy} onClick={() => act.mutate("resume")}
          title="Queue it again; it continues from its last checkpoint">Resume</button>
      )}
      {canCancel(job.status) && (
        <ConfirmButton label="Cancel job" danger question="Cancel this job? It stops after the current step."
          confirmLabel="Cancel job" dismissLabel="Keep it running" disabled={busy} onConfirm={() => act.mutate("cancel")} />
      )}
    </span>
  );
}

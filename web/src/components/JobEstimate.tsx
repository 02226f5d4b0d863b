// What the job the form describes would train and how long it would take, asked of the server
// (POST /v1/fine_tuning/estimate checks the body as creating the job would, and creates nothing)
// once the form has stopped changing: trained tokens, steps, evaluations and the time at this
// server's rate, with where that rate comes from.
import { useQuery } from "@tanstack/react-query";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { JobCreateBody } from "../lib/jobBody";
import { formatNumber } from "../lib/format";
import { formatSeconds } from "../lib/latency";
import { useDebounced } from "../lib/useDebounced";
import { useApi } from "../session";
import { ErrorBox } from "./States";

const SETTLE_MS = 400;
const rate = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });

export function JobEstimate({ body, ready }: { body: JobCreateBody; ready: boolean }) {
  const api = useApi();
  const settled = useDebounced(body, SETTLE_MS);
  const estimate = useQuery({
    queryKey: queryKeys.jobs.estimate(settled),
    queryFn: () => ok(api.http.POST("/v1/fine_tuning/estimate", { body: settled })),
    // The settled body may still be the one from before the files were chosen.
    enabled: ready && settled.training_file !== "" && settled.model !== "",
    // A refusal is the form's mistake, shown as the server words it; asking again would not change it.
    retry: false,
    placeholderData: (previous) => previous,
  });
  if (!ready) return <p className="muted" aria-label="Estimate">Choose a training file to see what the job would train.</p>;
  const e = estimate.data;
  return (
    <div aria-label="Estimate" role="group" className="estimate" aria-busy={estimate.isFetching}>
      {estimate.error ? (
        <ErrorBox error={estimate.error} title="This job would be refused" />
      ) : e ? (
        <p>
          Trains <strong data-testid="estimate-tokens">{formatNumber(e.trained_tokens)}</strong> tokens in{" "}
          {formatNumber(e.total_steps)} steps ({e.n_epochs} epoch{e.n_epochs === 1 ? "" : "s"}
          {e.evaluations > 0 && `, ${e.evaluations} evaluation${e.evaluations === 1 ? "" : "s"}`}): about{" "}
          <strong data-testid="estimate-time">{formatSeconds(e.estimated_seconds)}</strong> at{" "}
          {rate.format(e.tokens_per_second)} tokens/s{" "}
          <span className="muted">
            ({e.rate_source === "measured" ? "measured on this server's finished jobs" : "a default rate: no job has finished here yet"})
          </span>
          .
        </p>
      ) : (
        <p className="muted">Estimating…</p>
      )}
    </div>
  );
}

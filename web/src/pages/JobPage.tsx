import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useMemo } from "react";
import { Link, useParams } from "react-router-dom";
import { ok } from "../api/client";
import { allPages, lastId, useFileNames } from "../api/queries";
import { queryKeys } from "../api/queryKeys";
import { ConfirmButton } from "../components/Confirm";
import { LineChart } from "../components/LineChart";
import { Empty, ErrorBox, Loading } from "../components/States";
import { FileName } from "../components/FileName";
import { ProgressFacts } from "../components/JobProgress";
import { formatDate, formatNumber } from "../lib/format";
import { lossCurve } from "../lib/loss";
import { useApi, useSession } from "../session";

const FINISHED = ["succeeded", "failed", "cancelled"];
const LIVE_MS = 2000;

export function JobPage() {
  const jobId = useParams().jobId!;
  const api = useApi();
  const { me } = useSession();
  const client = useQueryClient();
  const path = { path: { job_id: jobId } };
  const job = useQuery({
    queryKey: queryKeys.jobs.one(jobId),
    queryFn: () => ok(api.http.GET("/v1/fine_tuning/jobs/{job_id}", { params: path })),
    refetchInterval: (query) => (query.state.data && FINISHED.includes(query.state.data.status) ? false : LIVE_MS),
  });
  const running = !job.data || !FINISHED.includes(job.data.status);
  // Events and checkpoints keep refreshing while the job runs, and once more after it ends.
  const events = useQuery({
    queryKey: queryKeys.jobs.events(jobId, job.data?.status),
    queryFn: () => allPages((after, limit) => ok(api.http.GET("/v1/fine_tuning/jobs/{job_id}/events",
      { params: { ...path, query: { after, limit, order: "asc" } } })), lastId),
    refetchInterval: running ? LIVE_MS : false,
    placeholderData: (previous) => previous,
  });
  const checkpoints = useQuery({
    queryKey: queryKeys.jobs.checkpoints(jobId, job.data?.status),
    queryFn: () => allPages((after, limit) => ok(api.http.GET("/v1/fine_tuning/jobs/{job_id}/checkpoints",
      { params: { ...path, query: { after, limit } } })), lastId),
    refetchInterval: running ? LIVE_MS : false,
    placeholderData: (previous) => previous,
  });
  const cancel = useMutation({
    mutationFn: () => ok(api.http.POST("/v1/fine_tuning/jobs/{job_id}/cancel", { params: path })),
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.jobs.all }),
  });
  const fileNames = useFileNames();
  const curve = useMemo(() => lossCurve(events.data ?? []), [events.data]);
  const evalPoints = curve.eval.filter((value) => value !== null).length;
  const series = useMemo(
    () => [
      { label: "train loss", color: "#2563eb", values: curve.train },
      { label: "eval loss", color: "#dc2626", values: curve.eval, points: true },
    ],
    [curve],
  );

  if (job.isPending) return <Loading what={`Loading ${jobId}`} />;
  if (job.error) return <ErrorBox error={job.error} />;
  const j = job.data;
  const produced = j.fine_tuned_model;
  const adapterName = produced?.split("@")[0];
  return (
    <section>
      <p><Link to="/training">← Training</Link></p>
      <div className="title-row">
        <h1 className="beside">{j.id}</h1>
        <span className={`badge ${j.status}`} data-testid="job-status">{j.status}</span>
        {!FINISHED.includes(j.status) && me.role !== "inference" && (
          <span className="push-right"><ConfirmButton label="Cancel job" danger question="Cancel this job? It stops after the current step."
            confirmLabel="Cancel job" dismissLabel="Keep it running" disabled={cancel.isPending || j.status === "cancel_requested"} onConfirm={() => cancel.mutate()} /></span>
        )}
      </div>
      <ErrorBox error={cancel.error} />
      {j.error && <ErrorBox error={new Error(`${j.error.code}: ${j.error.message}`)} title="Job failed" />}
      <dl className="facts">
        <dt>Adapter</dt><dd>{j.suffix}</dd>
        <dt>Produced</dt>
        <dd>
          {produced && adapterName ? (
            <>
              <Link to={`/adapters/${encodeURIComponent(adapterName)}`} data-testid="produced-version">{produced}</Link>{" "}
              · <Link to={`/playground?model=${encodeURIComponent(produced)}`}>chat with it</Link>
            </>
          ) : "—"}
        </dd>
        <dt>Training file</dt><dd><FileName id={j.training_file} names={fileNames.data} /></dd>
        <dt>Validation file</dt><dd>{j.validation_file ? <FileName id={j.validation_file} names={fileNames.data} /> : "none"}</dd>
        <ProgressFacts job={j} />
        <dt>Created</dt><dd>{formatDate(j.created_at)}</dd>
        <dt>Finished</dt><dd>{formatDate(j.finished_at)}</dd>
        <dt>Trained tokens</dt><dd>{formatNumber(j.trained_tokens)}</dd>
        <dt>Attempts</dt><dd>{j.attempts} of {j.max_attempts}</dd>
        <dt>Hyperparameters</dt>
        <dd>
          <ul className="inline-list" aria-label="Hyperparameters">
            {Object.entries(j.hyperparameters).map(([name, value]) => (
              <li key={name}>
                {name} <code>{Array.isArray(value) ? value.join(", ") : String(value)}</code>
              </li>
            ))}
          </ul>
        </dd>
      </dl>
      <h2>Loss</h2>
      {curve.steps.length === 0 ? (
        <Empty>{running ? "Waiting for the first step…" : "No steps were reported."}</Empty>
      ) : null}
      <div hidden={curve.steps.length === 0}>
        <LineChart label="Loss per step" x={curve.steps} series={series} xLabel="step" />
        <p className="muted" data-testid="eval-points" data-count={evalPoints}>
          {evalPoints === 0
            ? "No validation loss yet: it is measured at each checkpoint and at the end, when the job has a validation file."
            : `Validation loss at ${evalPoints} step${evalPoints === 1 ? "" : "s"} (the marked points).`}
        </p>
      </div>
      <h2>Checkpoints</h2>
      <ErrorBox error={checkpoints.error} />
      {(checkpoints.data ?? []).length === 0 ? (
        <Empty>{running ? "No checkpoints yet." : "This job kept no intermediate checkpoints; its result is the version above."}</Empty>
      ) : (
        <ul aria-label="Checkpoints">
          {checkpoints.data!.map((checkpoint) => (
            <li key={checkpoint.id}>
              step {checkpoint.step_number}: <code>{checkpoint.fine_tuned_model_checkpoint}</code>{" "}
              <Link to={`/playground?model=${encodeURIComponent(checkpoint.fine_tuned_model_checkpoint)}`}>chat</Link>
            </li>
          ))}
        </ul>
      )}
      <h2>Events</h2>
      <ErrorBox error={events.error} />
      {(events.data ?? []).length === 0 ? (
        <Empty>No events yet.</Empty>
      ) : (
        <ol className="events" aria-label="Events">
          {[...events.data!].reverse().map((event) => (
            <li key={event.id} className={event.level}>
              <time>{formatDate(event.created_at)}</time> {event.message}
            </li>
          ))}
        </ol>
      )}
    </section>
  );
}

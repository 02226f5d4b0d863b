import { useQuery } from "@tanstack/react-query";
import { Link, useParams } from "react-router-dom";
import { ok } from "../api/client";
import { allPages, lastId, useFileNames } from "../api/queries";
import { queryKeys } from "../api/queryKeys";
import { CheckpointList } from "../components/CheckpointList";
import { FileName } from "../components/FileName";
import { JobActions, useJobAction } from "../components/JobActions";
import { JobCharts } from "../components/JobCharts";
import { ProgressFacts } from "../components/JobProgress";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatDate, formatNumber } from "../lib/format";
import { RESTING } from "../lib/jobStatus";
import { useApi, useSession } from "../session";

const LIVE_MS = 2000;

export function JobPage() {
  const jobId = useParams().jobId!;
  const api = useApi();
  const { me } = useSession();
  const path = { path: { job_id: jobId } };
  const job = useQuery({
    queryKey: queryKeys.jobs.one(jobId),
    queryFn: () => ok(api.http.GET("/v1/fine_tuning/jobs/{job_id}", { params: path })),
    refetchInterval: (query) => (query.state.data && RESTING.includes(query.state.data.status) ? false : LIVE_MS),
  });
  const running = !job.data || !RESTING.includes(job.data.status);
  // Events and checkpoints keep refreshing while the job runs, and once more after it stops.
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
  const act = useJobAction(jobId);
  const fileNames = useFileNames();

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
        {me.role !== "inference" && <JobActions job={j} act={act} />}
      </div>
      <ErrorBox error={act.error} />
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
        <dt>Method</dt><dd data-testid="job-method">{String(j.method.type)}</dd>
        {j.early_stopping && <><dt>Early stopping</dt><dd>after {j.early_stopping.patience} evaluations without a better validation loss</dd></>}
        {j.from_checkpoint && <><dt>Started from</dt><dd><code>{j.from_checkpoint}</code></dd></>}
        {j.promote && (
          <>
            <dt>Promotes</dt>
            <dd>
              <code>{j.suffix}:{j.promote.alias}</code>{" "}
              {j.promote.when === "always" ? "on success" : "on success, if its validation loss beats the alias's"}
            </dd>
          </>
        )}
        {j.metadata && Object.keys(j.metadata).length > 0 && (
          <>
            <dt>Metadata</dt>
            <dd>
              <ul className="inline-list" aria-label="Metadata">
                {Object.entries(j.metadata).map(([key, value]) => <li key={key}>{key} <code>{value}</code></li>)}
              </ul>
            </dd>
          </>
        )}
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
      <JobCharts events={events.data ?? []} running={running} />
      <h2>Checkpoints</h2>
      <ErrorBox error={checkpoints.error} />
      {(checkpoints.data ?? []).length === 0 ? (
        <Empty>{running ? "No checkpoints yet." : "This job kept no intermediate checkpoints; its result is the version above."}</Empty>
      ) : (
        <CheckpointList checkpoints={checkpoints.data!} jobId={j.id} />
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

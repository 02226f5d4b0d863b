import { useQuery } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { useMemo } from "react";
import { Link, useSearchParams } from "react-router-dom";
import { ok } from "../api/client";
import { allPages, lastId, useFileNames } from "../api/queries";
import { queryKeys } from "../api/queryKeys";
import type { Job } from "../api/types";
import { DataTable } from "../components/DataTable";
import { DatasetUpload } from "../components/DatasetUpload";
import { FileName } from "../components/FileName";
import { JobForm } from "../components/JobForm";
import { ProgressCell } from "../components/JobProgress";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatDate } from "../lib/format";
import { presetFromCheckpoint } from "../lib/jobBody";
import { RESTING } from "../lib/jobStatus";
import { jobProgress } from "../lib/progress";
import { useApi, useSession } from "../session";

const column = createColumnHelper<Job>();

function jobColumns(fileNames: Map<string, string> | undefined) {
  return [
    column.accessor("id", { header: "Job", cell: (info) => <Link to={`/training/${info.getValue()}`}>{info.getValue()}</Link> }),
    column.accessor("suffix", { header: "Adapter" }),
    column.accessor("status", { header: "Status", cell: (info) => <span className={`badge ${info.getValue()}`}>{info.getValue()}</span> }),
    // Sorted by how far along: the fraction of steps done.
    column.accessor((job) => jobProgress(job)?.fraction, {
      id: "progress", header: "Progress", cell: (info) => <ProgressCell job={info.row.original} />, sortUndefined: "last",
    }),
    column.accessor((job) => fileNames?.get(job.training_file) ?? job.training_file, {
      id: "training_file", header: "Training file", cell: (info) => <FileName id={info.row.original.training_file} names={fileNames} />,
    }),
    column.accessor("fine_tuned_model", { header: "Produced", cell: (info) => info.getValue() ?? "—" }),
    column.accessor("created_at", { header: "Created", cell: (info) => formatDate(info.getValue()) }),
    column.accessor("finished_at", { header: "Finished", cell: (info) => formatDate(info.getValue()) }),
  ];
}

export function TrainingPage() {
  const api = useApi();
  const { me } = useSession();
  const jobs = useQuery({
    queryKey: queryKeys.jobs.all,
    queryFn: () => allPages((after, limit) => ok(api.http.GET("/v1/fine_tuning/jobs", { params: { query: { after, limit } } })), lastId),
    // Live while any job is still going.
    refetchInterval: (query) => (query.state.data?.some((job) => !RESTING.includes(job.status)) ? 3000 : false),
  });
  const fileNames = useFileNames();
  const columns = useMemo(() => jobColumns(fileNames.data), [fileNames.data]);
  return (
    <section>
      <h1>Training</h1>
      {me.role !== "inference" && (
        <div className="two-columns">
          <DatasetUpload />
          <NewJob />
        </div>
      )}
      <h2>Jobs</h2>
      {jobs.isPending ? (
        <Loading what="Loading jobs" />
      ) : jobs.error ? (
        <ErrorBox error={jobs.error} />
      ) : jobs.data.length === 0 ? (
        <Empty>No training jobs yet.</Empty>
      ) : (
        <DataTable label="Jobs" data={jobs.data} columns={columns} initialSort={[{ id: "created_at", desc: true }]} />
      )}
    </section>
  );
}

/** The form, or with `?from_job=...&from_checkpoint=...` (a checkpoint's "start a job from here") the form
 * filled from that job, starting from that checkpoint: its files, adapter, method and hyperparameters (a
 * checkpoint's rank and target modules must be the new job's). */
function NewJob() {
  const api = useApi();
  const [params] = useSearchParams();
  const fromJob = params.get("from_job");
  const checkpoint = params.get("from_checkpoint") ?? "";
  const source = useQuery({
    queryKey: queryKeys.jobs.one(fromJob ?? ""),
    queryFn: () => ok(api.http.GET("/v1/fine_tuning/jobs/{job_id}", { params: { path: { job_id: fromJob! } } })),
    enabled: fromJob !== null,
  });
  if (fromJob !== null && source.isPending) return <Loading what={`Loading ${fromJob}`} />;
  // Keyed by what it starts from: following another checkpoint's link fills the form afresh.
  return (
    <div>
      <ErrorBox error={source.error} />
      <JobForm key={`${fromJob}|${checkpoint}`} preset={presetFromCheckpoint(source.data ?? null, checkpoint)} />
    </div>
  );
}

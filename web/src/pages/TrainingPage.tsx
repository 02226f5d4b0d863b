import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { type FormEvent, useMemo, useState } from "react";
import { Link, useNavigate } from "react-router-dom";
import { ApiError, ok } from "../api/client";
import { components } from "../api/openapi.json";
import { allPages, lastId, useFileNames } from "../api/queries";
import { queryKeys } from "../api/queryKeys";
import type { FileObject, Job } from "../api/types";
import { DataTable } from "../components/DataTable";
import { FileName } from "../components/FileName";
import { ProgressCell } from "../components/JobProgress";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatDate, formatNumber } from "../lib/format";
import { jobProgress } from "../lib/progress";
import { defaultHelp, defaultText, hyperparameterBody, hyperparameterFields } from "../lib/hyperparameters";
import { useApi, useSession } from "../session";

const FINISHED = ["succeeded", "failed", "cancelled"];
// The form's fields from the API's own schema of hyperparameters, as the committed OpenAPI document has it.
const FIELDS = hyperparameterFields({ components });
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
    refetchInterval: (query) => (query.state.data?.some((job) => !FINISHED.includes(job.status)) ? 3000 : false),
  });
  const fileNames = useFileNames();
  const columns = useMemo(() => jobColumns(fileNames.data), [fileNames.data]);
  return (
    <section>
      <h1>Training</h1>
      {me.role !== "inference" && (
        <div className="two-columns">
          <DatasetUpload />
          <JobForm />
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

interface ReportLine {
  line: number | null;
  reason: string;
  message: string;
  param: string | null;
}

function DatasetUpload() {
  const api = useApi();
  const client = useQueryClient();
  const [file, setFile] = useState<File | null>(null);
  const [progress, setProgress] = useState<number | null>(null);
  const upload = useMutation({
    mutationFn: (chosen: File) => {
      const form = new FormData();
      form.append("purpose", "fine-tune");
      form.append("file", chosen, chosen.name);
      return api.upload<FileObject>("/v1/files", form, setProgress);
    },
    onSettled: () => setProgress(null),
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.files.all }),
  });
  const report = upload.error instanceof ApiError
    ? ((upload.error.details as { report?: { errors: ReportLine[]; num_errors: number } } | null)?.report ?? null)
    : null;
  const submit = (event: FormEvent) => {
    event.preventDefault();
    if (file) upload.mutate(file);
  };
  return (
    <form onSubmit={submit} aria-label="Upload a dataset" className="card">
      <h2>Dataset</h2>
      <p className="muted">JSONL: chat (<code>messages</code>), instruction (<code>prompt</code>/<code>completion</code>) or <code>text</code> lines.</p>
      <input type="file" accept=".jsonl,.json,.txt" aria-label="Dataset file" onChange={(event) => setFile(event.target.files?.[0] ?? null)} />
      <button type="submit" className="primary" disabled={!file || upload.isPending}>Upload dataset</button>
      {progress !== null && <progress aria-label="Dataset upload progress" max={1} value={progress} />}
      {upload.data && (
        <p role="status" className="ok">
          {upload.data.filename} accepted as <code>{upload.data.id}</code>: {upload.data.format} format,{" "}
          {formatNumber(upload.data.line_count)} examples, {formatNumber(upload.data.token_count)} tokens.
        </p>
      )}
      <ErrorBox error={upload.error} title="Refused" />
      {report && (
        <table aria-label="Dataset validation report">
          <thead>
            <tr><th>Line</th><th>Reason</th><th>Where</th><th>Message</th></tr>
          </thead>
          <tbody>
            {report.errors.map((error, index) => (
              <tr key={index}>
                <td>{error.line ?? "file"}</td>
                <td><code>{error.reason}</code></td>
                <td>{error.param ?? "—"}</td>
                <td>{error.message}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </form>
  );
}

function JobForm() {
  const api = useApi();
  const navigate = useNavigate();
  const client = useQueryClient();
  const files = useQuery({
    queryKey: queryKeys.files.fineTune,
    queryFn: () => allPages((after, limit) => ok(api.http.GET("/v1/files", { params: { query: { purpose: "fine-tune", after, limit } } })),
      lastId),
  });
  const models = useQuery({ queryKey: queryKeys.models.all, queryFn: () => ok(api.http.GET("/v1/models")) });
  const [trainingFile, setTrainingFile] = useState("");
  const [validationFile, setValidationFile] = useState("");
  const [suffix, setSuffix] = useState("");
  const [seed, setSeed] = useState("");
  const [values, setValues] = useState<Record<string, string>>({});
  const base = models.data?.data.find((model) => model.parent === null)?.id ?? "";
  const chosenTraining = trainingFile || files.data?.[0]?.id || "";
  const create = useMutation({
    mutationFn: () =>
      ok(api.http.POST("/v1/fine_tuning/jobs", { body: {
        model: base,
        training_file: chosenTraining,
        validation_file: validationFile || null,
        suffix,
        seed: seed ? Number(seed) : null,
        hyperparameters: hyperparameterBody(FIELDS, values),
      } })),
    onSuccess: async (job) => {
      await client.invalidateQueries({ queryKey: queryKeys.jobs.all });
      navigate(`/training/${job.id}`);
    },
  });
  const submit = (event: FormEvent) => {
    event.preventDefault();
    create.mutate();
  };
  return (
    <form onSubmit={submit} aria-label="Start a training job" className="card">
      <h2>New job</h2>
      <ErrorBox error={files.error ?? models.error} />
      <label>
        Training file{" "}
        <select aria-label="Training file" value={chosenTraining} onChange={(event) => setTrainingFile(event.target.value)}>
          {(files.data ?? []).map((file) => (
            <option key={file.id} value={file.id}>{file.filename} ({file.id})</option>
          ))}
        </select>
      </label>
      {files.data?.length === 0 && <p className="muted">Upload a dataset first.</p>}
      <label>
        Validation file{" "}
        <select aria-label="Validation file" value={validationFile} onChange={(event) => setValidationFile(event.target.value)}>
          <option value="">none</option>
          {(files.data ?? []).map((file) => (
            <option key={file.id} value={file.id}>{file.filename} ({file.id})</option>
          ))}
        </select>
      </label>
      <label>
        Adapter name (suffix) <input aria-label="Adapter name" value={suffix} onChange={(event) => setSuffix(event.target.value)} required />
      </label>
      <p className="help">The trained adapter becomes the next version of this adapter.</p>
      <label>
        Seed <input aria-label="Seed" type="number" value={seed} placeholder="random" onChange={(event) => setSeed(event.target.value)} />
      </label>
      <p className="help">Same seed, same data: same adapter.</p>
      <fieldset>
        <legend>Hyperparameters</legend>
        {FIELDS.map((field) => (
          <div key={field.name} className="field">
            <label>
              {field.name}{" "}
              <input
                aria-label={field.name}
                aria-describedby={`help-${field.name}`}
                value={values[field.name] ?? defaultText(field)}
                onChange={(event) => setValues({ ...values, [field.name]: event.target.value })}
              />
            </label>
            <p className="help" id={`help-${field.name}`}>
              {field.description} Default: {defaultHelp(field)}
              {field.minimum !== undefined && field.maximum !== undefined && ` (${field.minimum}–${field.maximum})`}.
            </p>
          </div>
        ))}
      </fieldset>
      <button type="submit" className="primary" disabled={!chosenTraining || !suffix || !base || create.isPending}>
        Start training
      </button>
      <ErrorBox error={create.error} />
    </form>
  );
}

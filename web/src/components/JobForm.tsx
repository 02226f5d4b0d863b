// The new-job form: files, the adapter it trains, the method (supervised, or DPO on preference files
// with its beta), the hyperparameters (from the server's own OpenAPI schemas, so defaults, bounds and
// help never disagree with the API), early stopping, metadata, an optional checkpoint to start from,
// and the server's estimate of the job before it is started.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { type FormEvent, useMemo, useState } from "react";
import { useNavigate } from "react-router-dom";
import { ok } from "../api/client";
import { components } from "../api/openapi.json";
import { allPages, lastId } from "../api/queries";
import { queryKeys } from "../api/queryKeys";
import type { FileObject } from "../api/types";
import { defaultHelp, defaultText, type FieldSpec, hyperparameterFields } from "../lib/hyperparameters";
import { EMPTY_FORM, jobBody, type JobFormState, type MethodType } from "../lib/jobBody";
import { useApi } from "../session";
import { JobEstimate } from "./JobEstimate";
import { ErrorBox } from "./States";

// Each method's hyperparameters, as the committed OpenAPI document has them (DPO's add beta).
const FIELDS: Record<MethodType, FieldSpec[]> = {
  supervised: hyperparameterFields({ components }, "Hyperparameters"),
  dpo: hyperparameterFields({ components }, "DpoHyperparameters"),
};

export function JobForm({ preset = {} }: { preset?: Partial<JobFormState> }) {
  const api = useApi();
  const navigate = useNavigate();
  const client = useQueryClient();
  const files = useQuery({
    queryKey: queryKeys.files.fineTune,
    queryFn: () => allPages((after, limit) => ok(api.http.GET("/v1/files", { params: { query: { purpose: "fine-tune", after, limit } } })),
      lastId),
  });
  const models = useQuery({ queryKey: queryKeys.models.all, queryFn: () => ok(api.http.GET("/v1/models")) });
  const [state, setState] = useState<JobFormState>({ ...EMPTY_FORM, ...preset });
  const set = (change: Partial<JobFormState>) => setState((current) => ({ ...current, ...change }));
  const base = models.data?.data.find((model) => model.parent === null)?.id ?? "";
  const chosen = { ...state, model: state.model || base, trainingFile: state.trainingFile || files.data?.[0]?.id || "" };
  const fields = FIELDS[state.method];
  // Memoized: the estimate waits for the body to stop changing, so it must keep its identity between renders
  // (chosen is rebuilt every render; what it is made of is listed instead).
  const { body, problem } = useMemo(() => jobBody(chosen, fields), [state, base, files.data, fields]); // eslint-disable-line
  const create = useMutation({
    mutationFn: () => ok(api.http.POST("/v1/fine_tuning/jobs", { body })),
    onSuccess: async (job) => {
      await client.invalidateQueries({ queryKey: queryKeys.jobs.all });
      navigate(`/training/${job.id}`);
    },
  });
  const submit = (event: FormEvent) => {
    event.preventDefault();
    create.mutate();
  };
  // The estimate needs files and the model; a metadata problem (not sent to it) only holds the submit back.
  const ready = Boolean(chosen.trainingFile && chosen.model);
  return (
    <form onSubmit={submit} aria-label="Start a training job" className="card">
      <h2>New job</h2>
      <ErrorBox error={files.error ?? models.error} />
      <fieldset className="choices">
        <legend>Method</legend>
        <label><input type="radio" name="method" checked={state.method === "supervised"} onChange={() => set({ method: "supervised" })} /> Supervised</label>
        <label><input type="radio" name="method" checked={state.method === "dpo"} onChange={() => set({ method: "dpo" })} /> DPO</label>
        <p className="help">
          {state.method === "dpo"
            ? "DPO learns to prefer each pair's preferred answer over the other: its files must be in the preference format."
            : "Supervised learns the assistant answers of chat, instruction or text files."}
        </p>
      </fieldset>
      <FileSelect label="Training file" files={files.data} value={chosen.trainingFile} onChange={(trainingFile) => set({ trainingFile })} />
      {files.data?.length === 0 && <p className="muted">Upload a dataset first.</p>}
      <FileSelect label="Validation file" files={files.data} value={state.validationFile} none
        onChange={(validationFile) => set({ validationFile })} />
      <label>
        Adapter name (suffix) <input aria-label="Adapter name" value={state.suffix} onChange={(event) => set({ suffix: event.target.value })} required />
      </label>
      <p className="help">The trained adapter becomes the next version of this adapter.</p>
      <label>
        Seed <input aria-label="Seed" type="number" value={state.seed} placeholder="random" onChange={(event) => set({ seed: event.target.value })} />
      </label>
      <p className="help">Same seed, same data: same adapter.</p>
      <fieldset>
        <legend>Hyperparameters</legend>
        {fields.map((field) => (
          <div key={field.name} className="field">
            <label>
              {field.name}{" "}
              <input aria-label={field.name} aria-describedby={`help-${field.name}`} value={state.values[field.name] ?? defaultText(field)}
                onChange={(event) => set({ values: { ...state.values, [field.name]: event.target.value } })} />
            </label>
            <p className="help" id={`help-${field.name}`}>
              {field.description} Default: {defaultHelp(field)}
              {field.minimum !== undefined && field.maximum !== undefined && ` (${field.minimum}–${field.maximum})`}.
            </p>
          </div>
        ))}
      </fieldset>
      <label>
        Early stopping patience{" "}
        <input aria-label="Early stopping patience" aria-describedby="help-patience" type="number" min={1} value={state.patience}
          placeholder="off" onChange={(event) => set({ patience: event.target.value })} />
      </label>
      <p className="help" id="help-patience">
        Optional: stop after this many evaluations in a row without a better validation loss (needs a validation file).
      </p>
      <label>
        Metadata{" "}
        <textarea aria-label="Metadata" aria-describedby="help-metadata" rows={2} value={state.metadata}
          placeholder={"team=search\nticket=ML-42"} onChange={(event) => set({ metadata: event.target.value })} />
      </label>
      <p className="help" id="help-metadata">Optional labels, one key=value a line, returned with the job.</p>
      <label>
        Start from checkpoint{" "}
        <input aria-label="Start from checkpoint" aria-describedby="help-checkpoint" value={state.fromCheckpoint} placeholder="none"
          onChange={(event) => set({ fromCheckpoint: event.target.value })} />
      </label>
      <p className="help" id="help-checkpoint">
        Optional: a checkpoint id (ftckpt-…) of one of your jobs; its LoRA weights are the start, so its rank and target modules must be this job's.
      </p>
      {problem && <p role="alert" className="error">{problem}</p>}
      <JobEstimate body={body} ready={ready} />
      <button type="submit" className="primary" disabled={!ready || problem !== null || !state.suffix || create.isPending}>
        Start training
      </button>
      <ErrorBox error={create.error} />
    </form>
  );
}

function FileSelect({ label, files, value, onChange, none = false }: {
  label: string; files: FileObject[] | undefined; value: string; onChange: (id: string) => void; none?: boolean;
}) {
  return (
    <label>
      {label}{" "}
      <select aria-label={label} value={value} onChange={(event) => onChange(event.target.value)}>
        {none && <option value="">none</option>}
        {(files ?? []).map((file) => (
          // The format beside the name: a DPO job needs preference files, a supervised one the others.
          <option key={file.id} value={file.id}>{file.filename} ({file.format}, {file.id})</option>
        ))}
      </select>
    </label>
  );
}

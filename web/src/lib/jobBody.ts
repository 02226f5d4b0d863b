// The job form's state as the body of POST /v1/fine_tuning/jobs (and of /v1/fine_tuning/estimate,
// which takes the same body): OpenAI's shapes for `method`, `early_stopping` and `metadata`. Values
// the form cannot read (a metadata line without "=") are problems shown beside the form; numbers
// that are not numbers are sent as typed, so that the server's message names the field.
import type { components } from "../api/schema";
import type { Job } from "../api/types";
import { type FieldSpec, hyperparameterBody } from "./hyperparameters";

export type JobCreateBody = components["schemas"]["JobCreateBody"];
export type MethodType = "supervised" | "dpo";

export interface JobFormState {
  model: string;
  trainingFile: string;
  validationFile: string;
  suffix: string;
  seed: string;
  method: MethodType;
  /** The hyperparameter inputs' text by field name (only those the user touched). */
  values: Record<string, string>;
  /** Early stopping's patience; empty: no early stopping. */
  patience: string;
  /** One `key=value` a line. */
  metadata: string;
  fromCheckpoint: string;
}

export const EMPTY_FORM: JobFormState = {
  model: "", trainingFile: "", validationFile: "", suffix: "", seed: "", method: "supervised", values: {},
  patience: "", metadata: "", fromCheckpoint: "",
};

export interface MetadataParse {
  metadata: Record<string, string> | null;
  problem: string | null;
}

/** `key=value` lines (blank lines skipped; the value may hold "="); null when there are none. */
export function parseMetadata(text: string): MetadataParse {
  const metadata: Record<string, string> = {};
  const lines = text.split("\n");
  for (const [index, raw] of lines.entries()) {
    const line = raw.trim();
    if (line === "") continue;
    const at = line.indexOf("=");
    const key = at < 0 ? "" : line.slice(0, at).trim();
    if (at < 0 || key === "") {
      return { metadata: null, problem: `metadata line ${index + 1}: write it as key=value` };
    }
    if (key in metadata) return { metadata: null, problem: `metadata line ${index + 1}: the key ${key} is given twice` };
    metadata[key] = line.slice(at + 1).trim();
  }
  return { metadata: Object.keys(metadata).length > 0 ? metadata : null, problem: null };
}

function numberOrText(text: string): number {
  const number = Number(text);
  // Not a number: sent as typed (the server's message names the field); the type says what it should be.
  return (Number.isNaN(number) ? text : number) as number;
}

export interface BuiltBody {
  body: JobCreateBody;
  problem: string | null;
}

/** The request body; `fields` are the chosen method's hyperparameters (DPO's include beta). */
export function jobBody(state: JobFormState, fields: FieldSpec[]): BuiltBody {
  const hyperparameters = hyperparameterBody(fields, state.values);
  const method: JobCreateBody["method"] = { type: state.method };
  // Only what differs from the defaults: an empty method body means "every default".
  if (Object.keys(hyperparameters).length > 0) method[state.method] = { hyperparameters };
  const patience = state.patience.trim();
  const { metadata, problem } = parseMetadata(state.metadata);
  return {
    body: {
      model: state.model,
      training_file: state.trainingFile,
      validation_file: state.validationFile || null,
      suffix: state.suffix.trim() || null,
      seed: state.seed.trim() ? numberOrText(state.seed.trim()) : null,
      method,
      early_stopping: patience ? { patience: numberOrText(patience) } : null,
      metadata,
      from_checkpoint: state.fromCheckpoint.trim() || null,
    },
    problem,
  };
}

/** The form filled from a job to start another from one of its checkpoints: the same files, adapter, method,
 * hyperparameters and early stopping (the checkpoint's rank and target modules must be the new job's). */
export function presetFromCheckpoint(
  job: Pick<Job, "training_file" | "validation_file" | "suffix" | "method" | "hyperparameters" | "early_stopping"> | null,
  checkpoint: string,
): Partial<JobFormState> {
  const preset: Partial<JobFormState> = checkpoint ? { fromCheckpoint: checkpoint } : {};
  if (job === null) return preset;
  const method = job.method.type === "dpo" ? "dpo" : "supervised";
  const values = Object.fromEntries(Object.entries(job.hyperparameters).map(
    ([name, value]) => [name, Array.isArray(value) ? value.join(", ") : String(value)]));
  return {
    ...preset, method, values, trainingFile: job.training_file, validationFile: job.validation_file ?? "", suffix: job.suffix,
    patience: job.early_stopping ? String(job.early_stopping.patience) : "",
  };
}

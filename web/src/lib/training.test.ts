// The pure pieces of the fine-tuning pages: curves from metrics events, the job form's request body,
// a job started from a checkpoint, and which buttons a job's status allows.
import { describe, expect, it } from "vitest";
import { components } from "../api/openapi.json";
import type { JobEvent } from "../api/types";
import { hyperparameterFields } from "./hyperparameters";
import { EMPTY_FORM, jobBody, parseMetadata, presetFromCheckpoint } from "./jobBody";
import { canCancel, canPause, canResume, RESTING } from "./jobStatus";
import { ACCURACY_METRICS, evaluatedSteps, LOSS_METRICS, metricCurves, presentSeries } from "./loss";

const metrics = (created_at: number, data: Record<string, unknown>): JobEvent => ({
  object: "fine_tuning.job.event", id: String(created_at), created_at, level: "info", message: "", type: "metrics", data,
});

describe("metricCurves", () => {
  it("orders steps and lets a resumed run's report of a step win", () => {
    const curves = metricCurves([metrics(3, { step: 1, train_loss: 0.5 }), metrics(1, { step: 1, train_loss: 2.0 }),
      metrics(2, { step: 2, train_loss: 1.5, valid_loss: 1.7 }),
      { object: "fine_tuning.job.event", id: "x", created_at: 4, level: "info", message: "done", type: "message", data: null }]);
    expect(curves.steps).toEqual([1, 2]);
    expect(curves.values.train_loss).toEqual([0.5, 1.5]);
    expect(curves.values.valid_loss).toEqual([null, 1.7]);
    expect(evaluatedSteps(curves)).toBe(1);
  });
  it("reads an older job's eval_loss as its validation loss, and prefers valid_loss where both are", () => {
    const curves = metricCurves([metrics(1, { step: 1, train_loss: 2, eval_loss: 1.9 }),
      metrics(2, { step: 2, train_loss: 1, eval_loss: 0.9, valid_loss: 0.8 })]);
    expect(curves.values.valid_loss).toEqual([1.9, 0.8]);
  });
  it("charts only the series a job reported: no accuracy chart for a job without accuracies", () => {
    const old = metricCurves([metrics(1, { step: 1, train_loss: 2, eval_loss: 1.9 })]);
    expect(presentSeries(old, LOSS_METRICS).map((s) => s.label)).toEqual(["train loss", "validation loss"]);
    expect(presentSeries(old, ACCURACY_METRICS)).toEqual([]);
    const current = metricCurves([metrics(1, { step: 1, train_loss: 2, train_mean_token_accuracy: 0.4 }),
      metrics(2, { step: 2, train_loss: 1, train_mean_token_accuracy: 0.6, valid_loss: 1.1, valid_mean_token_accuracy: 0.5,
        full_valid_loss: 1.1 })]);
    expect(presentSeries(current, LOSS_METRICS).map((s) => [s.label, s.points ?? false])).toEqual(
      [["train loss", false], ["validation loss", true], ["full validation loss", true]]);
    expect(presentSeries(current, ACCURACY_METRICS).map((s) => s.values)).toEqual([[0.4, 0.6], [null, 0.5]]);
  });
});

const supervised = hyperparameterFields({ components }, "Hyperparameters");
const dpo = hyperparameterFields({ components }, "DpoHyperparameters");

describe("jobBody", () => {
  const form = { ...EMPTY_FORM, model: "base", trainingFile: "file-a", suffix: "bot" };
  it("sends OpenAI's method shape, without hyperparameters left at their defaults", () => {
    const { body, problem } = jobBody(form, supervised);
    expect(problem).toBeNull();
    expect(body).toMatchObject({ model: "base", training_file: "file-a", validation_file: null, suffix: "bot", seed: null,
      method: { type: "supervised" }, early_stopping: null, metadata: null, from_checkpoint: null });
    expect(body.method).not.toHaveProperty("supervised");
  });
  it("puts DPO's beta under method.dpo, from the server's DPO schema", () => {
    expect(dpo.map((field) => field.name)).toContain("beta");
    expect(supervised.map((field) => field.name)).not.toContain("beta");
    const { body } = jobBody({ ...form, method: "dpo", values: { beta: "0.25", n_epochs: "2" } }, dpo);
    expect(body.method).toEqual({ type: "dpo", dpo: { hyperparameters: { beta: 0.25, n_epochs: 2 } } });
  });
  it("sends early stopping, metadata and the checkpoint to start from", () => {
    const { body } = jobBody({ ...form, validationFile: "file-b", patience: "3", metadata: "team=search\n\nurl=a=b",
      fromCheckpoint: " ftckpt-1 " }, supervised);
    expect(body).toMatchObject({ validation_file: "file-b", early_stopping: { patience: 3 },
      metadata: { team: "search", url: "a=b" }, from_checkpoint: "ftckpt-1" });
  });
  it("names the metadata line it cannot read", () => {
    expect(parseMetadata("a=1\nnot a pair").problem).toBe("metadata line 2: write it as key=value");
    expect(parseMetadata("a=1\n=2").problem).toBe("metadata line 2: write it as key=value");
    expect(parseMetadata("a=1\na=2").problem).toBe("metadata line 2: the key a is given twice");
    expect(jobBody({ ...form, metadata: "oops" }, supervised).problem).toMatch(/line 1/);
  });
});

describe("presetFromCheckpoint", () => {
  it("fills the form from the job with the checkpoint to start from", () => {
    const job = { training_file: "file-a", validation_file: null, suffix: "bot", method: { type: "dpo" },
      hyperparameters: { lora_r: 4, target_modules: ["q_proj", "v_proj"], beta: 0.2 }, early_stopping: { patience: 2 } };
    expect(presetFromCheckpoint(job, "ftckpt-9")).toEqual({ fromCheckpoint: "ftckpt-9", method: "dpo", trainingFile: "file-a",
      validationFile: "", suffix: "bot", patience: "2", values: { lora_r: "4", target_modules: "q_proj, v_proj", beta: "0.2" } });
    expect(presetFromCheckpoint(null, "ftckpt-9")).toEqual({ fromCheckpoint: "ftckpt-9" });
  });
  it("sends the same rank and modules as the job, so the checkpoint fits", () => {
    const job = { training_file: "f", validation_file: null, suffix: "s", method: { type: "supervised" },
      hyperparameters: { lora_r: 4, target_modules: ["q_proj"], n_epochs: 3 }, early_stopping: null };
    const { body } = jobBody({ ...EMPTY_FORM, ...presetFromCheckpoint(job, "c"), model: "base" }, supervised);
    expect(body.method).toEqual({ type: "supervised", supervised: { hyperparameters: { lora_r: 4, target_modules: ["q_proj"] } } });
  });
});

describe("job status", () => {
  it("offers pause while a job waits or runs, resume once it stopped short, cancel until it ends", () => {
    expect(["queued", "running", "paused", "failed", "succeeded"].filter(canPause)).toEqual(["queued", "running"]);
    expect(["queued", "running", "paused", "failed", "cancelled", "succeeded"].filter(canResume)).toEqual(["paused", "failed", "cancelled"]);
    expect(["running", "paused", "cancel_requested", "cancelled", "succeeded"].filter(canCancel)).toEqual(["running", "paused"]);
    expect(RESTING).toContain("paused");
  });
});

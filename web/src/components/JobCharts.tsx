// A job's curves per step: losses (train every step; validation, with an older job's eval_loss, and the
// final full validation as marked points), and token accuracy (or DPO's reward accuracy) when reported.
import { useMemo } from "react";
import type { JobEvent } from "../api/types";
import { ACCURACY_METRICS, evaluatedSteps, LOSS_METRICS, metricCurves, presentSeries } from "../lib/loss";
import { LineChart } from "./LineChart";
import { Empty } from "./States";

export function JobCharts({ events, running }: { events: JobEvent[]; running: boolean }) {
  const curves = useMemo(() => metricCurves(events), [events]);
  const loss = useMemo(() => presentSeries(curves, LOSS_METRICS), [curves]);
  const accuracy = useMemo(() => presentSeries(curves, ACCURACY_METRICS), [curves]);
  const evaluated = evaluatedSteps(curves);
  return (
    <>
      <h2>Loss</h2>
      {curves.steps.length === 0 && <Empty>{running ? "Waiting for the first step…" : "No steps were reported."}</Empty>}
      <div hidden={curves.steps.length === 0}>
        <LineChart label="Loss per step" x={curves.steps} series={loss} xLabel="step" />
        <p className="muted" data-testid="eval-points" data-count={evaluated}>
          {evaluated === 0
            ? "No validation loss yet: it is measured at the job's evaluation steps and at the end, when the job has a validation file."
            : `Validation loss at ${evaluated} step${evaluated === 1 ? "" : "s"} (the marked points).`}
        </p>
      </div>
      {accuracy.length > 0 && (
        <>
          <h2>Accuracy</h2>
          <LineChart label="Accuracy per step" x={curves.steps} series={accuracy} xLabel="step" />
          <p className="muted">The share of answer tokens the model ranked first{accuracy.some((s) => s.label.includes("reward"))
            ? "; for DPO, the share of pairs whose preferred answer gained more than the other" : ""}.</p>
        </>
      )}
    </>
  );
}

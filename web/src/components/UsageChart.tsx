// Requests and tokens per hour or day for one adapter, from GET /v1/usage/series.
import { useMemo, useState } from "react";
import { useUsageSeries } from "../api/queries";
import { LineChart } from "./LineChart";
import { Empty, ErrorBox, Loading } from "./States";

// How far back each granularity looks: enough buckets to see a trend, few enough to draw.
export const RANGES = { hour: 48 * 3600, day: 30 * 86400 } as const;

export function UsageChart({ adapter }: { adapter: string }) {
  const [granularity, setGranularity] = useState<"hour" | "day">("hour");
  const start = useMemo(() => new Date(Date.now() - RANGES[granularity] * 1000).toISOString(), [granularity]);
  const usage = useUsageSeries({ adapter, granularity, start });
  const range = useMemo<[number, number]>(() => [Date.parse(start) / 1000, Date.now() / 1000], [start]);
  const points = usage.data?.data ?? [];
  const x = useMemo(() => points.map((point) => Date.parse(point.start) / 1000), [points]);
  const requests = useMemo(() => [{ label: "requests", color: "#2563eb", values: points.map((p) => p.requests) }], [points]);
  const tokens = useMemo(
    () => [
      { label: "prompt tokens", color: "#16a34a", values: points.map((p) => p.prompt_tokens) },
      { label: "completion tokens", color: "#d97706", values: points.map((p) => p.completion_tokens) },
    ],
    [points],
  );
  return (
    <section aria-label="Usage">
      <div className="title-row">
        <h2>Usage</h2>
        <label>
          per{" "}
          <select value={granularity} onChange={(event) => setGranularity(event.target.value as "hour" | "day")}>
            <option value="hour">hour (last 48 h)</option>
            <option value="day">day (last 30 days)</option>
          </select>
        </label>
      </div>
      {usage.isPending ? (
        <Loading what="Loading usage" />
      ) : usage.error ? (
        <ErrorBox error={usage.error} />
      ) : points.length === 0 ? (
        <Empty>No requests to this adapter in this period.</Empty>
      ) : (
        <div className="charts">
          <LineChart label="Requests" x={x} series={requests} time xLabel="time" height={180} xRange={range} />
          <LineChart label="Tokens" x={x} series={tokens} time xLabel="time" height={180} xRange={range} />
        </div>
      )}
    </section>
  );
}

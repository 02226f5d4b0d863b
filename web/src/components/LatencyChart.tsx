// One adapter's latency (time to first token and end to end, p50 and p95), error rate and tokens per
// hour or day, from GET /v1/usage/latency: charts for the trend, and a table for the exact figures.
import { createColumnHelper } from "@tanstack/react-table";
import { useMemo, useState } from "react";
import { useLatencySeries } from "../api/queries";
import type { LatencyPoint } from "../api/types";
import { formatDate, formatNumber } from "../lib/format";
import { formatErrorRate, formatMs } from "../lib/latency";
import { DataTable } from "./DataTable";
import { LineChart } from "./LineChart";
import { Empty, ErrorBox, Loading } from "./States";
import { RANGES } from "./UsageChart";

const column = createColumnHelper<LatencyPoint>();
const columns = [
  column.accessor("start", { header: "Period from", cell: (info) => formatDate(info.getValue()) }),
  column.accessor("requests", { header: "Requests", cell: (info) => formatNumber(info.getValue()) }),
  column.accessor("error_rate", {
    header: "Errors",
    cell: (info) => `${formatNumber(info.row.original.errors)} (${formatErrorRate(info.row.original.errors, info.row.original.requests)})`,
  }),
  column.accessor("ttft_p50_ms", { header: "TTFT p50", cell: (info) => formatMs(info.getValue()), sortUndefined: "last" }),
  column.accessor("ttft_p95_ms", { header: "TTFT p95", cell: (info) => formatMs(info.getValue()), sortUndefined: "last" }),
  column.accessor("duration_p50_ms", { header: "Total p50", cell: (info) => formatMs(info.getValue()) }),
  column.accessor("duration_p95_ms", { header: "Total p95", cell: (info) => formatMs(info.getValue()) }),
  column.accessor("total_tokens", { header: "Tokens", cell: (info) => formatNumber(info.getValue()) }),
];

export function LatencyChart({ adapter }: { adapter: string }) {
  const [granularity, setGranularity] = useState<"hour" | "day">("hour");
  const start = useMemo(() => new Date(Date.now() - RANGES[granularity] * 1000).toISOString(), [granularity]);
  const latency = useLatencySeries({ adapter, granularity, start });
  const range = useMemo<[number, number]>(() => [Date.parse(start) / 1000, Date.now() / 1000], [start]);
  const points = useMemo(() => latency.data?.data ?? [], [latency.data]);
  const x = useMemo(() => points.map((point) => Date.parse(point.start) / 1000), [points]);
  const latencySeries = useMemo(
    () => [
      { label: "TTFT p50 (ms)", color: "#60a5fa", values: points.map((p) => p.ttft_p50_ms) },
      { label: "TTFT p95 (ms)", color: "#1d4ed8", values: points.map((p) => p.ttft_p95_ms) },
      { label: "total p50 (ms)", color: "#fbbf24", values: points.map((p) => p.duration_p50_ms) },
      { label: "total p95 (ms)", color: "#b45309", values: points.map((p) => p.duration_p95_ms) },
    ],
    [points],
  );
  const errorSeries = useMemo(
    () => [{ label: "error rate (%)", color: "#dc2626", values: points.map((p) => p.error_rate * 100) }],
    [points],
  );
  return (
    <section aria-label="Latency and errors">
      <div className="title-row">
        <h2>Latency and errors</h2>
        <label>
          per{" "}
          <select aria-label="Latency period" value={granularity}
            onChange={(event) => setGranularity(event.target.value as "hour" | "day")}>
            <option value="hour">hour (last 48 h)</option>
            <option value="day">day (last 30 days)</option>
          </select>
        </label>
      </div>
      <p className="muted">
        Percentiles of this adapter's requests (all versions). TTFT: time to the first token; total: from the request's
        arrival to its last token. Errors: requests the server failed or refused; a client that left is not one.
      </p>
      {latency.isPending ? (
        <Loading what="Loading latency" />
      ) : latency.error ? (
        <ErrorBox error={latency.error} />
      ) : points.length === 0 ? (
        <Empty>No requests to this adapter in this period.</Empty>
      ) : (
        <>
          <div className="charts">
            <LineChart label="Latency percentiles" x={x} series={latencySeries} time xLabel="time" height={180} xRange={range} />
            <LineChart label="Error rate" x={x} series={errorSeries} time xLabel="time" height={180} xRange={range} />
          </div>
          <DataTable label="Latency per period" data={points} columns={columns} initialSort={[{ id: "start", desc: true }]} />
        </>
      )}
    </section>
  );
}

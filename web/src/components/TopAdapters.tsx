// The slowest and the most failing adapters of the last 24 hours, from GET /v1/usage/top_adapters:
// a tenant's own, or every tenant's for the operator (who then sees which tenant each belongs to).
import { createColumnHelper } from "@tanstack/react-table";
import { useMemo } from "react";
import { Link } from "react-router-dom";
import { useTopAdapters } from "../api/queries";
import type { AdapterLatency } from "../api/types";
import { formatNumber } from "../lib/format";
import { formatErrorRate, formatMs } from "../lib/latency";
import { DataTable } from "./DataTable";
import { Empty, ErrorBox, Loading } from "./States";

const column = createColumnHelper<AdapterLatency>();

function columnsFor(allTenants: boolean, ownTenant: string) {
  return [
    ...(allTenants ? [column.accessor("tenant", { header: "Tenant" })] : []),
    column.accessor("adapter", {
      header: "Adapter",
      // Only the caller's own adapters have a page it can open.
      cell: (info) => (info.row.original.tenant === ownTenant && info.getValue() !== "base"
        ? <Link to={`/adapters/${encodeURIComponent(info.getValue())}`}>{info.getValue()}</Link>
        : info.getValue()),
    }),
    column.accessor("requests", { header: "Requests", cell: (info) => formatNumber(info.getValue()) }),
    column.accessor("errors", {
      header: "Errors",
      cell: (info) => `${formatNumber(info.getValue())} (${formatErrorRate(info.getValue(), info.row.original.requests)})`,
    }),
    column.accessor("ttft_p95_ms", { header: "TTFT p95", cell: (info) => formatMs(info.getValue()) }),
    column.accessor("duration_p50_ms", { header: "Total p50", cell: (info) => formatMs(info.getValue()) }),
    column.accessor("duration_p95_ms", { header: "Total p95", cell: (info) => formatMs(info.getValue()) }),
  ];
}

export function TopAdapters({ allTenants, ownTenant }: { allTenants: boolean; ownTenant: string }) {
  // Fixed when the page opens, so each refresh asks for the same period instead of a new query key.
  const start = useMemo(() => new Date(Date.now() - 24 * 3600 * 1000).toISOString(), []);
  const slowest = useTopAdapters({ order: "latency", start, all_tenants: allTenants });
  const failing = useTopAdapters({ order: "errors", start, all_tenants: allTenants });
  const columns = useMemo(() => columnsFor(allTenants, ownTenant), [allTenants, ownTenant]);
  const scope = allTenants ? "every tenant's" : "your";
  return (
    <section aria-label="Top adapters">
      <h2>Top adapters, last 24 h</h2>
      <p className="muted">From {scope} metered requests; p95: 95% of requests were at least this fast.</p>
      <h3>Slowest (by total p95)</h3>
      {slowest.isPending ? <Loading what="Loading" /> : slowest.error ? <ErrorBox error={slowest.error} /> : slowest.data.data.length === 0 ? (
        <Empty>No requests in the last 24 hours.</Empty>
      ) : (
        <DataTable label="Slowest adapters" data={slowest.data.data} columns={columns} />
      )}
      <h3>Most errors</h3>
      {failing.isPending ? <Loading what="Loading" /> : failing.error ? <ErrorBox error={failing.error} /> : failing.data.data.length === 0 ? (
        <Empty>No failed requests in the last 24 hours.</Empty>
      ) : (
        <DataTable label="Adapters with most errors" data={failing.data.data} columns={columns} />
      )}
    </section>
  );
}

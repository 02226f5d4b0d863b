// The operator's view of one tenant: whether it is suspended (and the switch, behind a confirmation),
// its keys (create, open one to revoke it), its usage by adapter over the last 30 days, and its limits.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { useMemo } from "react";
import { NavLink, useParams } from "react-router-dom";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { UsageBucket } from "../api/types";
import { ConfirmButton } from "../components/Confirm";
import { DataTable } from "../components/DataTable";
import { KeysSection } from "../components/KeysSection";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatDate, formatNumber } from "../lib/format";
import { formatErrorRate, formatMs } from "../lib/latency";
import { useApi, useSession } from "../session";

const column = createColumnHelper<UsageBucket>();
const usageColumns = [
  column.accessor((row) => row.adapter ?? "base", { id: "adapter", header: "Adapter" }),
  column.accessor("requests", { header: "Requests", cell: (info) => formatNumber(info.getValue()) }),
  column.accessor("errors", {
    header: "Errors",
    cell: (info) => `${formatNumber(info.getValue())} (${formatErrorRate(info.getValue(), info.row.original.requests)})`,
  }),
  column.accessor("prompt_tokens", { header: "Prompt tokens", cell: (info) => formatNumber(info.getValue()) }),
  column.accessor("completion_tokens", { header: "Completion tokens", cell: (info) => formatNumber(info.getValue()) }),
  column.accessor("mean_time_to_first_token_ms", { header: "Mean TTFT", cell: (info) => formatMs(info.getValue()) }),
  column.accessor("mean_duration_ms", { header: "Mean total", cell: (info) => formatMs(info.getValue()) }),
];

export function TenantPage() {
  const { name = "" } = useParams();
  const api = useApi();
  const { me } = useSession();
  const client = useQueryClient();
  const tenants = useQuery({ queryKey: queryKeys.tenants.all, queryFn: () => ok(api.http.GET("/v1/tenants")) });
  const since = useMemo(() => new Date(Date.now() - 30 * 86400 * 1000).toISOString(), []);
  const usage = useQuery({
    queryKey: queryKeys.usage.byAdapter(name, since),
    queryFn: () => ok(api.http.GET("/v1/usage", { params: { query: { tenant: name, group_by: "adapter", start: since } } })),
  });
  const toggle = useMutation({
    mutationFn: (suspend: boolean) => ok(api.http.POST(suspend ? "/v1/tenants/{tenant}/suspend" : "/v1/tenants/{tenant}/resume",
      { params: { path: { tenant: name } } })),
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.tenants.all }),
  });
  if (tenants.isPending) return <Loading what={`Loading ${name}`} />;
  if (tenants.error) return <ErrorBox error={tenants.error} />;
  const tenant = tenants.data.data.find((entry) => entry.name === name);
  if (tenant === undefined) return <><p><NavLink to="/tenants">← Tenants</NavLink></p><Empty>No tenant named {name}.</Empty></>;
  const suspended = tenant.suspended_at !== null;
  return (
    <section>
      <p><NavLink to="/tenants">← Tenants</NavLink></p>
      <div className="title-row">
        <h1 className="beside">Tenant {name}</h1>
        <span className={`badge ${suspended ? "suspended" : "active"}`} data-testid="tenant-state">
          {suspended ? "suspended" : "active"}
        </span>
      </div>
      <dl className="facts">
        <dt>Id</dt><dd><code>{tenant.id}</code></dd>
        <dt>Created</dt><dd>{formatDate(tenant.created_at)}</dd>
        <dt>Suspended</dt><dd>{suspended ? formatDate(tenant.suspended_at) : "no"}</dd>
        <dt>Limits</dt><dd><NavLink to={`/tenants/${encodeURIComponent(name)}/limits`}>Rate limits and quotas</NavLink></dd>
      </dl>
      {/* Not the operator's own tenant: suspending it would lock out the keys that could resume it (the server refuses). */}
      {name !== me.tenant && (
        <div className="row">
          {suspended ? (
            <ConfirmButton label="Resume tenant" question={`Resume ${name}? Its keys work again at once.`}
              confirmLabel="Resume" disabled={toggle.isPending} onConfirm={() => toggle.mutate(false)} />
          ) : (
            <ConfirmButton label="Suspend tenant" danger
              question={`Suspend ${name}? Every key of it is refused and its requests in flight end.`}
              confirmLabel="Suspend" disabled={toggle.isPending} onConfirm={() => toggle.mutate(true)} />
          )}
        </div>
      )}
      <ErrorBox error={toggle.error} />
      <h2>Keys</h2>
      <KeysSection tenant={name} />
      <h2>Usage, last 30 days</h2>
      {usage.isPending ? (
        <Loading what="Loading usage" />
      ) : usage.error ? (
        <ErrorBox error={usage.error} />
      ) : usage.data.data.length === 0 ? (
        <Empty>No requests in the last 30 days.</Empty>
      ) : (
        <DataTable label="Usage by adapter" data={usage.data.data} columns={usageColumns} />
      )}
    </section>
  );
}

import { createColumnHelper } from "@tanstack/react-table";
import { useMemo, useState } from "react";
import { Link } from "react-router-dom";
import { useAdapters, useEngineStatus, useUsageSeries } from "../api/queries";
import type { Adapter } from "../api/types";
import { DataTable } from "../components/DataTable";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatAgo, formatBytes, formatDate, formatNumber } from "../lib/format";
import { placeOf, totalsByAdapter } from "../lib/residency";

interface Row {
  adapter: Adapter;
  name: string;
  latest: number;
  aliases: string;
  rank: number | undefined;
  modules: string;
  size: number | undefined;
  created: string;
  lastUsed: string | null;
  requests: number;
  tokens: number;
  place: string;
}

const column = createColumnHelper<Row>();

export function AdaptersPage() {
  const adapters = useAdapters();
  const since = useMemo(() => new Date(Date.now() - 24 * 3600 * 1000).toISOString(), []);
  const usage = useUsageSeries({ granularity: "hour", start: since });
  const engine = useEngineStatus(5000);
  const [search, setSearch] = useState("");

  const rows = useMemo<Row[]>(() => {
    const totals = totalsByAdapter(usage.data?.data ?? []);
    const lastUsed = new Map<string, string>();
    for (const point of usage.data?.data ?? []) {
      if (point.adapter && point.requests > 0) lastUsed.set(point.adapter, point.start);
    }
    return (adapters.data ?? []).map((adapter) => ({
      adapter,
      name: adapter.name,
      latest: adapter.aliases.latest ?? 0,
      aliases: Object.keys(adapter.aliases).filter((alias) => alias !== "latest").sort().join(", "),
      rank: adapter.latest_version?.rank,
      modules: adapter.latest_version?.target_modules.join(", ") ?? "",
      size: adapter.latest_version?.size_bytes,
      created: adapter.created_at,
      lastUsed: lastUsed.get(adapter.name) ?? null,
      requests: totals.get(adapter.name)?.requests ?? 0,
      tokens: totals.get(adapter.name)?.tokens ?? 0,
      place: placeOf(adapter.name, engine.data?.adapters, engine.data?.device),
    }));
  }, [adapters.data, usage.data, engine.data]);

  const columns = useMemo(
    () => [
      column.accessor("name", {
        header: "Name",
        cell: (info) => <Link to={`/adapters/${encodeURIComponent(info.getValue())}`}>{info.getValue()}</Link>,
      }),
      column.accessor("latest", { header: "Latest", cell: (info) => `v${info.getValue()}` }),
      column.accessor("aliases", { header: "Aliases", cell: (info) => info.getValue() || "—" }),
      // An adapter with no ready version yet has no rank or size: it sorts after the others.
      column.accessor("rank", { header: "Rank", cell: (info) => info.getValue() ?? "—", sortUndefined: "last" }),
      column.accessor("modules", { header: "Target modules", cell: (info) => info.getValue() || "—" }),
      column.accessor("size", {
        header: "Size",
        cell: (info) => (info.getValue() === undefined ? "—" : formatBytes(info.getValue()!)),
        sortUndefined: "last",
      }),
      column.accessor("created", { header: "Created", cell: (info) => formatDate(info.getValue()) }),
      column.accessor("lastUsed", {
        header: "Last used",
        cell: (info) => <LastUsed hourStart={info.getValue()} />,
        sortUndefined: "last",
      }),
      column.accessor("requests", { header: "Requests 24 h", cell: (info) => formatNumber(info.getValue()) }),
      column.accessor("tokens", { header: "Tokens 24 h", cell: (info) => formatNumber(info.getValue()) }),
      column.accessor("place", { header: "Resident", cell: (info) => <span className="badge">{info.getValue()}</span> }),
    ],
    [],
  );

  return (
    <section>
      <div className="title-row">
        <h1>Adapters</h1>
        <Link className="button primary" to="/upload">Upload an adapter</Link>
      </div>
      <input
        type="search"
        aria-label="Search adapters"
        placeholder="Search by name, alias…"
        value={search}
        onChange={(event) => setSearch(event.target.value)}
      />
      <ErrorBox error={usage.error} title="Usage" />
      <ErrorBox error={engine.error} title="Residency" />
      {adapters.isPending ? (
        <Loading what="Loading adapters" />
      ) : adapters.error ? (
        <ErrorBox error={adapters.error} />
      ) : rows.length === 0 ? (
        <Empty>
          No adapters yet. <Link to="/upload">Upload one</Link> or <Link to="/training">train one</Link>.
        </Empty>
      ) : (
        <DataTable label="Adapters" data={rows} columns={columns} search={search} initialSort={[{ id: "name", desc: false }]} />
      )}
    </section>
  );
}

/** Usage is counted per hour, so the last use is known to the hour: shown as the end of its hour. */
function LastUsed({ hourStart }: { hourStart: string | null }) {
  if (hourStart === null) return <>not in 24 h</>;
  const end = Date.parse(hourStart) + 3600 * 1000;
  return <>{end > Date.now() ? "this hour" : formatAgo(new Date(end).toISOString())}</>;
}

import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { useMemo, useState } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import { ok } from "../api/client";
import { allPages } from "../api/queries";
import { queryKeys } from "../api/queryKeys";
import type { Adapter, Version, VersionPage } from "../api/types";
import { ConfirmButton } from "../components/Confirm";
import { DataTable } from "../components/DataTable";
import { Empty, ErrorBox, Loading } from "../components/States";
import { LatencyChart } from "../components/LatencyChart";
import { UsageChart } from "../components/UsageChart";
import { formatBytes, formatDate } from "../lib/format";
import { useApi, useSession } from "../session";

const column = createColumnHelper<Version>();

export function AdapterPage() {
  const name = useParams().name!;
  const api = useApi();
  const adapter = useQuery({
    queryKey: queryKeys.adapters.one(name),
    queryFn: () => ok(api.http.GET("/v1/adapters/{name}", { params: { path: { name } } })),
  });
  const versions = useQuery({
    queryKey: queryKeys.adapters.versions(name),
    queryFn: () => allPages<VersionPage, number>(
      (after, limit) => ok(api.http.GET("/v1/adapters/{name}/versions", { params: { path: { name }, query: { after, limit } } })),
      (page) => page.data[page.data.length - 1]?.version,
    ),
  });
  const columns = useMemo(
    () => [
      column.accessor("version", { header: "Version", cell: (info) => `v${info.getValue()}` }),
      column.accessor("rank", { header: "Rank" }),
      column.accessor("alpha", { header: "Alpha" }),
      column.accessor((v) => v.target_modules.join(", "), { id: "modules", header: "Target modules" }),
      column.accessor((v) => v.declared_base_model ?? "", {
        id: "declared_base", header: "Declared base",
        cell: (info) => (
          <span title={info.row.original.base_model_warning ?? undefined}>
            {info.getValue()}
            {info.row.original.base_model_warning ? " (warning: not the served base)" : ""}
          </span>
        ),
      }),
      column.accessor((v) => v.files.reduce((sum, file) => sum + file.size_bytes, 0), {
        id: "size", header: "Size", cell: (info) => formatBytes(info.getValue()),
      }),
      column.accessor((v) => v.files.find((f) => f.filename.endsWith(".safetensors"))?.sha256 ?? "", {
        id: "sha256", header: "sha256", cell: (info) => <code title={info.getValue()}>{info.getValue().slice(0, 12)}</code>,
      }),
      column.accessor("source", {
        header: "Source",
        cell: (info) => {
          const job = info.row.original.training_job_id;
          return job ? <Link to={`/training/${job}`}>training job {job}</Link> : info.getValue();
        },
      }),
      column.accessor("created_by_key_id", { header: "Created by", cell: (info) => <KeyName id={info.getValue()} /> }),
      column.accessor("created_at", { header: "Created", cell: (info) => formatDate(info.getValue()) }),
      column.accessor((v) => v.aliases.join(", "), { id: "aliases", header: "Aliases" }),
    ],
    [],
  );

  if (adapter.isPending) return <Loading what={`Loading ${name}`} />;
  if (adapter.error) return <ErrorBox error={adapter.error} />;
  return (
    <section>
      <p><Link to="/adapters">← Adapters</Link></p>
      <h1>{name}</h1>
      {adapter.data.description && <p>{adapter.data.description}</p>}
      <Aliases adapter={adapter.data} versions={versions.data ?? []} />
      <h2>Versions</h2>
      {versions.isPending ? (
        <Loading what="Loading versions" />
      ) : versions.error ? (
        <ErrorBox error={versions.error} />
      ) : versions.data.length === 0 ? (
        <Empty>No versions.</Empty>
      ) : (
        <DataTable label="Versions" data={versions.data} columns={columns} initialSort={[{ id: "version", desc: true }]} />
      )}
      <LatencyChart adapter={name} />
      <UsageChart adapter={name} />
      <DeleteAdapter name={name} />
    </section>
  );
}

/** Deleting is here, on the adapter's own page, not on the list's rows: one click away from a
 * mis-aimed row is too close for an action that removes every version. */
function DeleteAdapter({ name }: { name: string }) {
  const api = useApi();
  const { me } = useSession();
  const client = useQueryClient();
  const navigate = useNavigate();
  const remove = useMutation({
    mutationFn: () => ok(api.http.DELETE("/v1/adapters/{name}", { params: { path: { name }, query: { force: true } } })),
    onSuccess: async () => {
      client.removeQueries({ queryKey: queryKeys.adapters.one(name) });
      await client.invalidateQueries({ queryKey: queryKeys.adapters.all, exact: true });
      navigate("/adapters");
    },
  });
  if (me.role === "inference") return null;
  return (
    <section aria-label="Delete" className="danger-zone">
      <h2>Delete</h2>
      <p className="muted">Deletes every version and alias of {name}. Requests naming it are refused from then on.</p>
      <ConfirmButton
        label="Delete adapter"
        danger
        question={`Delete ${name} and all its versions?`}
        confirmLabel="Delete"
        disabled={remove.isPending}
        onConfirm={() => remove.mutate()}
      />
      <ErrorBox error={remove.error} />
    </section>
  );
}

/** A key id as the caller's tenant lists it (its name and prefix), or the bare id if not listed. */
function KeyName({ id }: { id: string | null }) {
  const api = useApi();
  const keys = useQuery({
    queryKey: queryKeys.keys.of(null),
    queryFn: () => ok(api.http.GET("/v1/keys")),
    staleTime: 60_000,
    retry: false,
  });
  if (id === null) return <>—</>;
  const key = keys.data?.data.find((entry) => entry.id === id);
  return <span title={id}>{key ? `${key.name} (${key.prefix}…)` : id.slice(0, 8)}</span>;
}

function Aliases({ adapter, versions }: { adapter: Adapter; versions: Version[] }) {
  const { me } = useSession();
  const names = Object.keys(adapter.aliases).sort((a, b) => (a === "latest" ? -1 : b === "latest" ? 1 : a.localeCompare(b)));
  return (
    <section aria-label="Aliases">
      <h2>Aliases</h2>
      <ul className="aliases">
        {names.map((alias) => (
          <AliasItem key={alias} adapter={adapter.name} alias={alias} version={adapter.aliases[alias]} />
        ))}
      </ul>
      {me.role !== "inference" && <Promote adapter={adapter.name} versions={versions} />}
    </section>
  );
}

function useMoveAlias(adapter: string, alias: string) {
  const api = useApi();
  const client = useQueryClient();
  return useMutation({
    mutationFn: (version: number) =>
      ok(api.http.PUT("/v1/adapters/{name}/aliases/{alias}", { params: { path: { name: adapter, alias } }, body: { version } })),
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.adapters.all }),
  });
}

function Promote({ adapter, versions }: { adapter: string; versions: Version[] }) {
  const [alias, setAlias] = useState("prod");
  const newest = versions.reduce((max, v) => Math.max(max, v.version), 0);
  const [chosen, setChosen] = useState<number | null>(null);
  const version = chosen ?? newest;
  const move = useMoveAlias(adapter, alias);
  return (
    <div className="promote" role="group" aria-label="Promote">
      <label>
        Alias <input value={alias} onChange={(event) => setAlias(event.target.value)} size={12} aria-label="Alias name" />
      </label>
      <label>
        version{" "}
        <select aria-label="Version to promote" value={version} onChange={(event) => setChosen(Number(event.target.value))}>
          {[...versions].sort((a, b) => b.version - a.version).map((v) => (
            <option key={v.version} value={v.version}>v{v.version}</option>
          ))}
        </select>
      </label>
      <ConfirmButton
        label="Promote"
        question={`Point ${adapter}:${alias} at v${version}?`}
        disabled={!alias || !version || move.isPending}
        onConfirm={() => move.mutate(version)}
      />
      <ErrorBox error={move.error} />
    </div>
  );
}

function AliasItem({ adapter, alias, version }: { adapter: string; alias: string; version: number }) {
  const api = useApi();
  const { me } = useSession();
  const history = useQuery({
    queryKey: queryKeys.adapters.aliasHistory(adapter, alias),
    queryFn: () => ok(api.http.GET("/v1/adapters/{name}/aliases/{alias}/history", { params: { path: { name: adapter, alias } } })),
  });
  const move = useMoveAlias(adapter, alias);
  const moves = history.data?.data ?? [];
  // Rollback: back to where the alias pointed before its latest move.
  const previous = moves.length > 0 ? moves[moves.length - 1].from_version : null;
  return (
    <li data-alias={alias}>
      <strong>{adapter}:{alias}</strong> → <span className="alias-version">v{version}</span>{" "}
      {alias !== "latest" && me.role !== "inference" && previous !== null && (
        <ConfirmButton
          label={`Roll back to v${previous}`}
          question={`Point ${adapter}:${alias} back at v${previous}?`}
          disabled={move.isPending}
          onConfirm={() => move.mutate(previous)}
        />
      )}
      <ErrorBox error={move.error ?? history.error} />
      {moves.length > 0 && (
        <details>
          <summary>History ({moves.length})</summary>
          <ol className="history" aria-label={`${alias} history`}>
            {moves.map((entry, index) => (
              <li key={index}>
                {formatDate(entry.changed_at)}: {entry.from_version === null ? "created" : `v${entry.from_version}`} →{" "}
                {entry.to_version === null ? "deleted" : `v${entry.to_version}`}
              </li>
            ))}
          </ol>
        </details>
      )}
    </li>
  );
}

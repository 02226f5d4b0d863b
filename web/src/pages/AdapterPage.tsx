import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { useMemo } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import { ok } from "../api/client";
import { allPages } from "../api/queries";
import { queryKeys } from "../api/queryKeys";
import type { Version, VersionPage } from "../api/types";
import { Aliases } from "../components/Aliases";
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

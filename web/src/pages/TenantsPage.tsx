import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { type FormEvent, useState } from "react";
import { NavLink } from "react-router-dom";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { Tenant } from "../api/types";
import { DataTable } from "../components/DataTable";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatDate } from "../lib/format";
import { useApi } from "../session";

const column = createColumnHelper<Tenant>();
const columns = [
  column.accessor("name", {
    header: "Name",
    cell: (info) => <NavLink to={`/tenants/${encodeURIComponent(info.getValue())}`}>{info.getValue()}</NavLink>,
  }),
  column.accessor((tenant) => (tenant.suspended_at ? "suspended" : "active"), {
    id: "state", header: "State", cell: (info) => <span className={`badge ${info.getValue()}`}>{info.getValue()}</span>,
  }),
  column.accessor("id", { header: "Id", cell: (info) => <code>{info.getValue()}</code> }),
  column.accessor("created_at", { header: "Created", cell: (info) => formatDate(info.getValue()) }),
  column.display({
    id: "limits",
    header: "Limits",
    cell: (info) => <NavLink to={`/tenants/${encodeURIComponent(info.row.original.name)}/limits`}>Rate limits</NavLink>,
  }),
];

export function TenantsPage() {
  const api = useApi();
  const client = useQueryClient();
  const tenants = useQuery({ queryKey: queryKeys.tenants.all, queryFn: () => ok(api.http.GET("/v1/tenants")) });
  const [name, setName] = useState("");
  const create = useMutation({
    mutationFn: () => ok(api.http.POST("/v1/tenants", { body: { name } })),
    onSuccess: () => {
      setName("");
      return client.invalidateQueries({ queryKey: queryKeys.tenants.all });
    },
  });
  const submit = (event: FormEvent) => {
    event.preventDefault();
    create.mutate();
  };
  return (
    <section>
      <h1>Tenants</h1>
      <p className="muted">Open a tenant to manage its keys, see its usage, or suspend it.</p>
      <form onSubmit={submit} className="row" aria-label="Create a tenant">
        <label>
          Name <input value={name} onChange={(event) => setName(event.target.value)} aria-label="Tenant name" required />
        </label>
        <button type="submit" className="primary" disabled={!name || create.isPending}>Create tenant</button>
      </form>
      <ErrorBox error={create.error} />
      {tenants.isPending ? (
        <Loading what="Loading tenants" />
      ) : tenants.error ? (
        <ErrorBox error={tenants.error} />
      ) : tenants.data.data.length === 0 ? (
        <Empty>No tenants.</Empty>
      ) : (
        <DataTable label="Tenants" data={tenants.data.data} columns={columns} />
      )}
    </section>
  );
}

// A tenant's API keys: the list (each name opens the key's page, where it is revoked) and the form
// that creates one, shown once. For the caller's own tenant (Keys page), or, for the operator, any
// tenant named (the tenant's page): the API's `tenant` parameter and body field.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { type FormEvent, useMemo, useState } from "react";
import { Link } from "react-router-dom";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { Key, Role } from "../api/types";
import { formatAgo, formatDate } from "../lib/format";
import { useApi, useSession } from "../session";
import { DataTable } from "./DataTable";
import { Empty, ErrorBox, Loading } from "./States";

const column = createColumnHelper<Key>();

/** The keys of `tenant` (undefined: the caller's own), under one query key per tenant. */
export function useKeys(tenant: string | undefined) {
  const api = useApi();
  return useQuery({
    queryKey: queryKeys.keys.of(tenant ?? null),
    queryFn: () => ok(api.http.GET("/v1/keys", { params: { query: { tenant } } })),
  });
}

/** Where a key's page is: under its tenant's page for the operator's drill-down, else under Keys. */
export function keyPath(keyId: string, tenant: string | undefined): string {
  return tenant === undefined ? `/keys/${keyId}` : `/tenants/${encodeURIComponent(tenant)}/keys/${keyId}`;
}

export function KeysSection({ tenant }: { tenant?: string }) {
  const api = useApi();
  const { me } = useSession();
  const client = useQueryClient();
  const keys = useKeys(tenant);
  const [name, setName] = useState("");
  const [role, setRole] = useState<Role>("developer");
  const create = useMutation({
    mutationFn: () => ok(api.http.POST("/v1/keys", { body: { name, role, ...(tenant === undefined ? {} : { tenant }) } })),
    onSuccess: () => {
      setName("");
      return client.invalidateQueries({ queryKey: queryKeys.keys.all });
    },
  });
  const columns = useMemo(
    () => [
      column.accessor("name", {
        header: "Name",
        cell: (info) => <Link to={keyPath(info.row.original.id, tenant)}>{info.getValue()}</Link>,
      }),
      column.accessor("prefix", { header: "Prefix", cell: (info) => <code>{info.getValue()}…</code> }),
      column.accessor("role", { header: "Role" }),
      column.accessor("created_at", { header: "Created", cell: (info) => formatDate(info.getValue()) }),
      column.accessor("last_used_at", { header: "Last used", cell: (info) => formatAgo(info.getValue()) }),
      column.accessor("expires_at", { header: "Expires", cell: (info) => (info.getValue() ? formatDate(info.getValue()) : "never") }),
      column.accessor((key) => keyState(key, me.key_id), { id: "state", header: "State" }),
    ],
    [me.key_id, tenant],
  );
  const submit = (event: FormEvent) => {
    event.preventDefault();
    create.mutate();
  };
  return (
    <section aria-label="Keys">
      <form onSubmit={submit} className="row" aria-label="Create a key">
        <label>
          Name <input value={name} onChange={(event) => setName(event.target.value)} aria-label="Key name" required />
        </label>
        <label>
          Role{" "}
          <select value={role} onChange={(event) => setRole(event.target.value as Role)} aria-label="Key role">
            <option value="admin">admin</option>
            <option value="developer">developer</option>
            <option value="inference">inference</option>
          </select>
        </label>
        <button type="submit" className="primary" disabled={!name || create.isPending}>Create key</button>
      </form>
      <ErrorBox error={create.error} />
      {create.data && (
        <div className="ok" role="status">
          New key <strong>{create.data.name}</strong>: <code data-testid="new-key">{create.data.key}</code>
          <p>Copy it now: it is shown this once and cannot be read back.</p>
        </div>
      )}
      {keys.isPending ? (
        <Loading what="Loading keys" />
      ) : keys.error ? (
        <ErrorBox error={keys.error} />
      ) : keys.data.data.length === 0 ? (
        <Empty>No keys.</Empty>
      ) : (
        <DataTable label="Keys" data={keys.data.data} columns={columns} />
      )}
    </section>
  );
}

export function keyState(key: Key, callerKeyId: string): string {
  if (key.revoked_at) return `revoked ${formatDate(key.revoked_at)}`;
  if (key.expires_at && Date.parse(key.expires_at) <= Date.now()) return "expired";
  return key.id === callerKeyId ? "active (this key)" : "active";
}

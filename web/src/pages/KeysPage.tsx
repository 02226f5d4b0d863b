import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { createColumnHelper } from "@tanstack/react-table";
import { type FormEvent, useMemo, useState } from "react";
import type { CreatedKey, Key, Role } from "../api/types";
import { ConfirmButton } from "../components/Confirm";
import { DataTable } from "../components/DataTable";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatAgo, formatDate } from "../lib/format";
import { useApi, useSession } from "../session";

const column = createColumnHelper<Key>();

export function KeysPage() {
  const api = useApi();
  const { me } = useSession();
  const client = useQueryClient();
  const keys = useQuery({ queryKey: ["keys"], queryFn: () => api.get<{ data: Key[] }>("/v1/keys") });
  const [name, setName] = useState("");
  const [role, setRole] = useState<Role>("developer");
  const create = useMutation({
    mutationFn: () => api.post<CreatedKey>("/v1/keys", { name, role }),
    onSuccess: () => {
      setName("");
      return client.invalidateQueries({ queryKey: ["keys"] });
    },
  });
  const revoke = useMutation({
    mutationFn: (id: string) => api.delete<Key>(`/v1/keys/${id}`),
    onSuccess: () => client.invalidateQueries({ queryKey: ["keys"] }),
  });
  const columns = useMemo(
    () => [
      column.accessor("name", { header: "Name" }),
      column.accessor("prefix", { header: "Prefix", cell: (info) => <code>{info.getValue()}…</code> }),
      column.accessor("role", { header: "Role" }),
      column.accessor("created_at", { header: "Created", cell: (info) => formatDate(info.getValue()) }),
      column.accessor("last_used_at", { header: "Last used", cell: (info) => formatAgo(info.getValue()) }),
      column.accessor("expires_at", { header: "Expires", cell: (info) => (info.getValue() ? formatDate(info.getValue()) : "never") }),
      column.accessor("revoked_at", {
        header: "State",
        cell: (info) =>
          info.getValue() ? (
            `revoked ${formatDate(info.getValue())}`
          ) : info.row.original.id === me.key_id ? (
            "this key"
          ) : (
            <ConfirmButton label="Revoke" danger question={`Revoke ${info.row.original.name}? Requests with it will be refused.`}
              confirmLabel="Revoke" onConfirm={() => revoke.mutate(info.row.original.id)} />
          ),
      }),
    ],
    [me.key_id, revoke],
  );
  const submit = (event: FormEvent) => {
    event.preventDefault();
    create.mutate();
  };
  return (
    <section>
      <h1>API keys of {me.tenant}</h1>
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
      <ErrorBox error={revoke.error} />
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

// One API key: its facts and, for a key not yet revoked, Revoke behind a confirmation. Reached from
// the Keys page (the caller's tenant) or a tenant's page (the operator, `tenant` in the path).
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { Link, useParams } from "react-router-dom";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import { ConfirmButton } from "../components/Confirm";
import { keyState, useKeys } from "../components/KeysSection";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatAgo, formatDate } from "../lib/format";
import { useApi, useSession } from "../session";

export function KeyPage() {
  const { keyId = "", name: tenant } = useParams();
  const api = useApi();
  const { me } = useSession();
  const client = useQueryClient();
  const keys = useKeys(tenant);
  const revoke = useMutation({
    mutationFn: () => ok(api.http.DELETE("/v1/keys/{key_id}", { params: { path: { key_id: keyId } } })),
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.keys.all }),
  });
  const back = tenant === undefined
    ? <Link to="/keys">← Keys</Link>
    : <Link to={`/tenants/${encodeURIComponent(tenant)}`}>← Tenant {tenant}</Link>;
  if (keys.isPending) return <Loading what="Loading the key" />;
  if (keys.error) return <><p>{back}</p><ErrorBox error={keys.error} /></>;
  const key = keys.data.data.find((entry) => entry.id === keyId);
  if (key === undefined) return <><p>{back}</p><Empty>No key {keyId} in this tenant.</Empty></>;
  return (
    <section>
      <p>{back}</p>
      <h1>Key {key.name}</h1>
      <dl className="facts">
        <dt>Prefix</dt><dd><code>{key.prefix}…</code></dd>
        <dt>Role</dt><dd>{key.role}</dd>
        <dt>State</dt><dd data-testid="key-state">{keyState(key, me.key_id)}</dd>
        <dt>Created</dt><dd>{formatDate(key.created_at)}</dd>
        <dt>Last used</dt><dd>{formatAgo(key.last_used_at)}</dd>
        <dt>Expires</dt><dd>{key.expires_at ? formatDate(key.expires_at) : "never"}</dd>
        <dt>Id</dt><dd><code>{key.id}</code></dd>
      </dl>
      {key.revoked_at === null && key.id !== me.key_id && (
        <ConfirmButton label="Revoke" danger question={`Revoke ${key.name}? Requests with it will be refused.`}
          confirmLabel="Revoke" disabled={revoke.isPending} onConfirm={() => revoke.mutate()} />
      )}
      {key.id === me.key_id && <p className="muted">This is the key you are signed in with; revoke it from another key.</p>}
      <ErrorBox error={revoke.error} />
    </section>
  );
}

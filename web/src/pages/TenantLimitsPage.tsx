// The operator's view of one tenant's rate limits and quotas: read them, change them, save them all
// at once (PUT replaces every limit: an empty field is unlimited). The server checks the values; its
// refusal (a 400 naming the field) is shown as it is.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { type FormEvent, useEffect, useState } from "react";
import { NavLink, useParams } from "react-router-dom";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { TenantLimits, TenantLimitsBody } from "../api/types";
import { ErrorBox, Loading } from "../components/States";
import { useApi } from "../session";

type CountField = Exclude<keyof TenantLimitsBody, "share_weight">;

export const LIMIT_FIELDS: { name: CountField; label: string; hint: string }[] = [
  { name: "requests_per_minute", label: "Requests per minute", hint: "per tenant, all keys together" },
  { name: "tokens_per_minute", label: "Tokens per minute", hint: "prompt + max_tokens, trued up to what was used" },
  { name: "max_concurrent_requests", label: "Concurrent requests", hint: "generations in flight at once" },
  { name: "max_training_jobs", label: "Concurrent training jobs", hint: "the others wait queued" },
  { name: "monthly_tokens", label: "Tokens per month", hint: "input + output, per UTC month" },
];

type Draft = Record<CountField | "share_weight", string>;

function draftOf(limits: TenantLimits | TenantLimitsBody): Draft {
  const draft = { share_weight: String(limits.share_weight) } as Draft;
  for (const { name } of LIMIT_FIELDS) draft[name] = limits[name] == null ? "" : String(limits[name]);
  return draft;
}

/** The PUT body: an empty field is null (unlimited); anything else is sent as the number typed, for the server to check. */
export function limitsOf(draft: Draft): TenantLimitsBody {
  const limits: TenantLimitsBody = { share_weight: draft.share_weight.trim() === "" ? 1 : Number(draft.share_weight) };
  for (const { name } of LIMIT_FIELDS) limits[name] = draft[name].trim() === "" ? null : Number(draft[name]);
  return limits;
}

export function TenantLimitsPage() {
  const { name = "" } = useParams();
  const api = useApi();
  const client = useQueryClient();
  const path = { params: { path: { tenant: name } } };
  const limits = useQuery({
    queryKey: queryKeys.tenants.limits(name),
    queryFn: () => ok(api.http.GET("/v1/tenants/{tenant}/limits", path)),
  });
  const [draft, setDraft] = useState<Draft | null>(null);
  useEffect(() => {
    if (limits.data) setDraft(draftOf(limits.data));
  }, [limits.data]);
  const save = useMutation({
    mutationFn: (body: TenantLimitsBody) => ok(api.http.PUT("/v1/tenants/{tenant}/limits", { ...path, body })),
    onSuccess: (saved) => client.setQueryData(queryKeys.tenants.limits(name), saved),
  });
  const submit = (event: FormEvent) => {
    event.preventDefault();
    if (draft) save.mutate(limitsOf(draft));
  };
  const field = (key: keyof Draft) => ({
    value: draft?.[key] ?? "",
    onChange: (event: React.ChangeEvent<HTMLInputElement>) => setDraft((old) => (old ? { ...old, [key]: event.target.value } : old)),
  });
  return (
    <section>
      <h1>Limits of {name}</h1>
      <p><NavLink to="/tenants">All tenants</NavLink> · An empty field is unlimited; saving replaces every limit.</p>
      {limits.isPending || !draft ? (
        limits.error ? <ErrorBox error={limits.error} /> : <Loading what="Loading limits" />
      ) : (
        <form onSubmit={submit} aria-label="Tenant limits" className="limits">
          {LIMIT_FIELDS.map(({ name: key, label, hint }) => (
            <label key={key}>
              {label} <input inputMode="numeric" aria-label={label} placeholder="unlimited" {...field(key)} />{" "}
              <span className="muted">{hint}</span>
            </label>
          ))}
          <label>
            Fair-share weight <input inputMode="decimal" aria-label="Fair-share weight" {...field("share_weight")} />{" "}
            <span className="muted">2 gets twice the tokens of 1 while both wait</span>
          </label>
          <div className="row">
            <button type="submit" className="primary" disabled={save.isPending}>Save limits</button>
            {save.isSuccess && !save.isPending && <span role="status" className="ok">Saved</span>}
          </div>
          <ErrorBox error={save.error} />
        </form>
      )}
    </section>
  );
}

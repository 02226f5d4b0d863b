// An adapter's aliases: the version each names, or its split between versions (a canary) with the
// split's editor, Promote (the split ends on its canary) and Rollback (it ends on the version named
// before), each version's figures side by side, and each alias's history. Pointing an alias at one
// version (the Promote group) and rolling a plain alias back are PUTs of that version.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { Adapter, AliasMove, AliasState, Version } from "../api/types";
import { formatDate } from "../lib/format";
import { canaryOf, formatSplit, splitStartedAt, versionBeforeSplit } from "../lib/split";
import { useApi, useSession } from "../session";
import { CanaryFigures } from "./CanaryFigures";
import { ConfirmButton } from "./Confirm";
import { SplitEditor } from "./SplitEditor";
import { ErrorBox } from "./States";

const LATEST = "latest";

export function Aliases({ adapter, versions }: { adapter: Adapter; versions: Version[] }) {
  const { me } = useSession();
  const names = Object.keys(adapter.aliases).sort((a, b) => (a === LATEST ? -1 : b === LATEST ? 1 : a.localeCompare(b)));
  const numbers = versions.map((v) => v.version);
  return (
    <section aria-label="Aliases">
      <h2>Aliases</h2>
      <ul className="aliases">
        {names.map((alias) => (
          <AliasItem key={alias} adapter={adapter.name} alias={alias} version={adapter.aliases[alias]} versions={numbers} />
        ))}
      </ul>
      {me.role !== "inference" && <Promote adapter={adapter.name} versions={versions} />}
    </section>
  );
}

type AliasCall = { kind: "set"; version: number } | { kind: "promote"; version: number } | { kind: "rollback" };

function useAliasCall(adapter: string, alias: string) {
  const api = useApi();
  const client = useQueryClient();
  return useMutation({
    mutationFn: (call: AliasCall) => {
      const path = { params: { path: { name: adapter, alias } } };
      if (call.kind === "set") return ok(api.http.PUT("/v1/adapters/{name}/aliases/{alias}", { ...path, body: { version: call.version } }));
      if (call.kind === "promote") {
        return ok(api.http.POST("/v1/adapters/{name}/aliases/{alias}/promote", { ...path, body: { version: call.version } }));
      }
      return ok(api.http.POST("/v1/adapters/{name}/aliases/{alias}/rollback", path));
    },
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.adapters.all }),
  });
}

function Promote({ adapter, versions }: { adapter: string; versions: Version[] }) {
  const [alias, setAlias] = useState("prod");
  const newest = versions.reduce((max, v) => Math.max(max, v.version), 0);
  const [chosen, setChosen] = useState<number | null>(null);
  const version = chosen ?? newest;
  const move = useAliasCall(adapter, alias);
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
        onConfirm={() => move.mutate({ kind: "set", version })}
      />
      <ErrorBox error={move.error} />
    </div>
  );
}

function AliasItem({ adapter, alias, version, versions }: { adapter: string; alias: string; version: number; versions: number[] }) {
  const api = useApi();
  const { me } = useSession();
  const path = { params: { path: { name: adapter, alias } } };
  const history = useQuery({
    queryKey: queryKeys.adapters.aliasHistory(adapter, alias),
    queryFn: () => ok(api.http.GET("/v1/adapters/{name}/aliases/{alias}/history", path)),
  });
  // The adapter lists each alias's version only; the alias itself says whether it is split.
  const state = useQuery({
    queryKey: queryKeys.adapters.alias(adapter, alias),
    queryFn: () => ok(api.http.GET("/v1/adapters/{name}/aliases/{alias}", path)),
    enabled: alias !== LATEST,
  });
  const call = useAliasCall(adapter, alias);
  const moves = history.data?.data ?? [];
  const split = state.data?.split ?? null;
  const developer = me.role !== "inference";
  return (
    <li data-alias={alias}>
      <strong>{adapter}:{alias}</strong> → <span className="alias-version">v{version}</span>{" "}
      {split && <span className="alias-split" data-testid={`split-${alias}`}>split {formatSplit(split)}</span>}{" "}
      {developer && alias !== LATEST && (split
        ? <SplitActions adapter={adapter} alias={alias} split={split} moves={moves} call={call} />
        : <PlainRollback adapter={adapter} alias={alias} moves={moves} call={call} />)}
      <ErrorBox error={call.error ?? history.error ?? state.error} />
      {split && <CanaryFigures adapter={adapter} alias={alias} split={split} since={splitStartedAt(moves) ?? state.data!.updated_at} />}
      {developer && state.data && (
        // Keyed by what the server has: after a save, promote or rollback the editor closes and starts from it.
        <details key={`${state.data.version}|${JSON.stringify(state.data.split)}|${versions.length}`}>
          <summary>{split ? "Edit the split" : "Split (canary)"}</summary>
          <SplitEditor adapter={adapter} current={state.data} versions={versions} />
        </details>
      )}
      {moves.length > 0 && <History alias={alias} moves={moves} />}
    </li>
  );
}

type Call = ReturnType<typeof useAliasCall>;

/** A plain alias: back to where it pointed before its latest move. */
function PlainRollback({ adapter, alias, moves, call }: { adapter: string; alias: string; moves: AliasMove[]; call: Call }) {
  const previous = moves.length > 0 ? moves[moves.length - 1].from_version : null;
  if (previous === null) return null;
  return (
    <ConfirmButton label={`Roll back to v${previous}`} question={`Point ${adapter}:${alias} back at v${previous}?`}
      disabled={call.isPending} onConfirm={() => call.mutate({ kind: "set", version: previous })} />
  );
}

/** A split alias: promote its canary (the newest version), or roll back to the version named before the split. */
function SplitActions({ adapter, alias, split, moves, call }: {
  adapter: string; alias: string; split: NonNullable<AliasState["split"]>; moves: AliasMove[]; call: Call;
}) {
  const canary = canaryOf(split);
  const before = versionBeforeSplit(moves);
  return (
    <>
      <ConfirmButton label={`Promote v${canary}`} question={`End the split: point ${adapter}:${alias} at v${canary} alone?`}
        disabled={call.isPending} onConfirm={() => call.mutate({ kind: "promote", version: canary })} />{" "}
      {before !== null && (
        <ConfirmButton label={`Roll back to v${before}`} question={`End the split: point ${adapter}:${alias} back at v${before} alone?`}
          disabled={call.isPending} onConfirm={() => call.mutate({ kind: "rollback" })} />
      )}
    </>
  );
}

/** What a change did, beside its versions (a plain `set` says nothing more). */
const ACTIONS: Record<string, string> = {
  promote: "promote",
  rollback: "rollback",
  job_promote: "promoted by its fine-tuning job",
  gated_promote: "promoted by its fine-tuning job's gate",
  gate_refused: "kept: its fine-tuning job's gate refused",
};

const lossFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 4 });

/** A gated promotion's comparison: the job's version's validation loss against the alias's best. */
function gateText(gate: AliasMove["gate"]): string {
  if (!gate) return "";
  const current = gate.current_valid_loss === null || gate.current_valid_loss === undefined
    ? "nothing to compare" : lossFormat.format(gate.current_valid_loss);
  return `; validation loss of v${gate.new_version} ${lossFormat.format(gate.new_valid_loss)} against ${current}`;
}

function describe(entry: AliasMove): string {
  const from = entry.from_version === null ? "created" : `v${entry.from_version}`;
  if (entry.action === "split" && entry.split) return `${from} → split ${formatSplit(entry.split)}`;
  const to = entry.to_version === null ? "deleted" : `v${entry.to_version}`;
  const action = ACTIONS[entry.action];
  return action ? `${from} → ${to} (${action}${gateText(entry.gate)})` : `${from} → ${to}`;
}

function History({ alias, moves }: { alias: string; moves: AliasMove[] }) {
  return (
    <details>
      <summary>History ({moves.length})</summary>
      <ol className="history" aria-label={`${alias} history`}>
        {moves.map((entry, index) => (
          <li key={index}>{formatDate(entry.changed_at)}: {describe(entry)}</li>
        ))}
      </ol>
    </details>
  );
}

import { createColumnHelper } from "@tanstack/react-table";
import { useEffect, useMemo, useState } from "react";
import { Link } from "react-router-dom";
import { useEngineStatus } from "../api/queries";
import type { ModelSpeculation, Residency, ServerEngineStatus } from "../api/types";
import { DataTable } from "../components/DataTable";
import { LineChart } from "../components/LineChart";
import { Empty, ErrorBox, Loading } from "../components/States";
import { formatBytes, formatNumber } from "../lib/format";
import { addSample, rate, type Sample } from "../lib/rate";
import { sharedSlots, slotName } from "../lib/residency";
import { TopAdapters } from "../components/TopAdapters";
import { useSession } from "../session";

const REFRESH_MS = 2000;
const column = createColumnHelper<Residency>();

function residencyColumns(device: string, shared: Map<number, string[]>) {
  return [
    column.accessor("reference", {
      header: "Adapter version",
      cell: (info) => <Link to={`/adapters/${encodeURIComponent(info.row.original.adapter)}`}>{info.getValue()}</Link>,
    }),
    column.accessor("location", { header: "Where", cell: (info) => (info.getValue() === "gpu" ? slotName(device) : "host cache") }),
    column.accessor("slot", {
      header: "Slot",
      cell: (info) => {
        const slot = info.getValue();
        if (slot === null) return "—";
        const others = (shared.get(slot) ?? []).filter((reference) => reference !== info.row.original.reference);
        if (others.length === 0) return String(slot);
        const names = others.length <= 3 ? others.join(", ") : `${others.length} other names`;
        return `${slot} (shared with ${names}: identical weights)`;
      },
    }),
  ];
}

// What the API gives: a tenant sees its own requests and adapters; the operator's key also gets the
// whole engine (`server`), shown below them.
export function ServerPage() {
  const status = useEngineStatus(REFRESH_MS);
  const { me } = useSession();
  const shared = useMemo(() => sharedSlots(status.data?.adapters ?? []), [status.data]);
  const columns = useMemo(() => residencyColumns(status.data?.device ?? "cpu", shared), [status.data?.device, shared]);
  if (status.isPending) return <Loading what="Loading server status" />;
  if (status.error) return <ErrorBox error={status.error} />;
  const s = status.data;
  const onGpu = s.device.startsWith("cuda");
  return (
    <section>
      <h1>Server</h1>
      <p className="muted" data-testid="engine-device">
        Model {s.model} on {onGpu ? `GPU (${s.device})` : "CPU"}; refreshed every {REFRESH_MS / 1000} s.
      </p>
      <p className="help" data-testid="slots-explained">
        An adapter in use is copied into one of the engine's adapter slots ({onGpu ? "in GPU memory" : "in CPU memory: this server has no GPU"});
        the others wait in the host cache or in storage. Versions, adapters or checkpoints whose weights are byte-identical
        share one slot, so a slot may hold several names.
      </p>
      <dl className="stats" aria-label="Your requests">
        <Stat label="Your requests running" value={formatNumber(s.num_running)} />
        <Stat label="Your requests waiting" value={formatNumber(s.num_waiting)} />
      </dl>
      <h2>Your resident adapters</h2>
      {s.adapters.length === 0 ? (
        <Empty>None of your adapters is in a {slotName(s.device)} or the host cache now.</Empty>
      ) : (
        <DataTable label="Resident adapters" data={s.adapters} columns={columns} />
      )}
      <h2>Speculative decoding</h2>
      <p className="help">
        The engine proposes tokens that followed the same words earlier in a request, or in your adapter's recent
        answers (yours only), and keeps those the model agrees with: each accepted token is a step saved. The output
        is the same either way.
      </p>
      <SpeculationTable label="Your speculative decoding" lines={s.speculation} showTenant={false} />
      {s.server && <WholeEngine server={s.server} at={status.dataUpdatedAt / 1000} device={s.device} />}
      {me.role !== "inference" && <TopAdapters allTenants={me.operator} ownTenant={me.tenant} />}
    </section>
  );
}

function WholeEngine({ server, at, device }: { server: ServerEngineStatus; at: number; device: string }) {
  const [samples, setSamples] = useState<Sample[]>([]);
  const [points, setPoints] = useState<{ at: number[]; tps: (number | null)[] }>({ at: [], tps: [] });

  useEffect(() => {
    const sample = { at, total: server.generation_tokens_total };
    setSamples((current) => {
      const next = addSample(current, sample);
      const tps = rate(next);
      setPoints((old) => ({ at: [...old.at, sample.at].slice(-120), tps: [...old.tps, tps].slice(-120) }));
      return next;
    });
  }, [server, at]);

  const series = useMemo(() => [{ label: "generated tokens/s", color: "#2563eb", values: points.tps }], [points]);
  const tps = rate(samples);
  const kv = server.kv_blocks_total ? server.kv_blocks_used / server.kv_blocks_total : 0;
  const lookups = server.host_cache_hits + server.host_cache_misses;
  return (
    <>
      <h2>Whole engine, every tenant</h2>
      <dl className="stats" aria-label="Server status">
        <Stat label="Running" value={formatNumber(server.num_running)} />
        <Stat label="Waiting" value={formatNumber(server.num_waiting)} />
        <Stat label="Tokens/s" value={tps === null ? "…" : tps.toFixed(1)} />
        <Stat label="KV cache" value={`${(kv * 100).toFixed(0)}% (${server.kv_blocks_used}/${server.kv_blocks_total} blocks)`} />
        <Stat label={`Adapter slots (${device.startsWith("cuda") ? "GPU" : "CPU"})`} value={`${server.adapter_slots_used}/${server.adapter_slots_total}`} />
        <Stat label="Host cache" value={`${server.host_cache_adapters} adapters`} />
        <Stat label="Host-cache hits" value={lookups ? `${formatNumber(server.host_cache_hits)} of ${formatNumber(lookups)}` : "none yet"} />
        <Stat label="Preemptions" value={formatNumber(server.preemptions_total)} />
        <Stat label="Draft acceptance" value={formatRate(server.speculation.acceptance_rate)} />
        <Stat label="Answer store" value={`${formatNumber(server.speculation.store_tokens)} tokens, ${formatBytes(server.speculation.store_bytes)}`} />
      </dl>
      <h3>Speculative decoding by model</h3>
      <SpeculationTable label="Speculative decoding by model" lines={server.speculation.models} showTenant />
      <h3>Generated tokens per second</h3>
      <LineChart label="Generated tokens per second" x={points.at} series={series} time xLabel="time" height={180} />
    </>
  );
}

/** An acceptance rate as a percentage; "no drafts yet" before any. */
function formatRate(rate: number | null | undefined): string {
  return rate === null || rate === undefined ? "no drafts yet" : `${(rate * 100).toFixed(1)}%`;
}

const speculationColumn = createColumnHelper<ModelSpeculation>();

function SpeculationTable({ label, lines, showTenant }: { label: string; lines: ModelSpeculation[]; showTenant: boolean }) {
  const columns = useMemo(
    () => [
      ...(showTenant ? [speculationColumn.accessor((line) => line.tenant ?? "", { id: "tenant", header: "Tenant" })] : []),
      speculationColumn.accessor("model", { header: "Model" }),
      speculationColumn.accessor("draft_tokens", { header: "Proposed tokens", cell: (info) => formatNumber(info.getValue()) }),
      speculationColumn.accessor("accepted_tokens", { header: "Accepted", cell: (info) => formatNumber(info.getValue()) }),
      speculationColumn.accessor("acceptance_rate", { header: "Acceptance", cell: (info) => formatRate(info.getValue()) }),
    ],
    [showTenant],
  );
  if (lines.length === 0) return <Empty>No drafts verified yet.</Empty>;
  return <DataTable label={label} data={lines} columns={columns} />;
}

function Stat({ label, value }: { label: string; value: string }) {
  return (
    <div>
      <dt>{label}</dt>
      <dd>{value}</dd>
    </div>
  );
}

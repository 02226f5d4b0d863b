// Query keys and fetchers shared by pages, so a change on one page refreshes the others.
import { useQuery } from "@tanstack/react-query";
import { useApi } from "../session";
import { type Api, withQuery } from "./client";
import type { Adapter, FileObject, Page, UsageBucket } from "./types";

/** Every page of a cursor-paginated list (the console's lists are small enough to hold whole). */
export async function allPages<T>(api: Api, path: string, cursor: (page: Page<T>) => string | undefined): Promise<T[]> {
  const items: T[] = [];
  let after: string | undefined;
  for (;;) {
    const page = await api.get<Page<T>>(withQuery(path, { limit: 100, after }));
    items.push(...page.data);
    if (!page.has_more || page.data.length === 0) return items;
    after = cursor(page);
  }
}

export function useAdapters() {
  const api = useApi();
  return useQuery({
    queryKey: ["adapters"],
    queryFn: () => allPages<Adapter>(api, "/v1/adapters", (page) => page.last_id ?? undefined),
  });
}

export interface Residency {
  adapter: string;
  version: number;
  reference: string;
  location: "gpu" | "host";
  slot: number | null;
}

/** The whole engine, every tenant's load: only in the operator's view. */
export interface ServerEngineStatus {
  num_running: number;
  num_waiting: number;
  kv_blocks_used: number;
  kv_blocks_total: number;
  kv_blocks_cached: number;
  adapter_slots_used: number;
  adapter_slots_total: number;
  prompt_tokens_total: number;
  generation_tokens_total: number;
  preemptions_total: number;
  host_cache_hits: number;
  host_cache_misses: number;
  host_cache_adapters: number;
}

/** The caller's tenant's view: its own requests and resident adapters; `server` for the operator only. */
export interface EngineStatus {
  model: string;
  device: string;
  num_running: number;
  num_waiting: number;
  adapters: Residency[];
  server: ServerEngineStatus | null;
}

export function useEngineStatus(refetchInterval: number | false = false) {
  const api = useApi();
  return useQuery({
    queryKey: ["engine-status"],
    queryFn: () => api.get<EngineStatus>("/v1/engine/status"),
    refetchInterval,
  });
}

export interface UsagePoint {
  start: string;
  adapter: string | null;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** Per-adapter request and token counts in time buckets (GET /v1/usage/series). */
export function useUsageSeries(params: { adapter?: string; granularity: "hour" | "day"; start: string }) {
  const api = useApi();
  return useQuery({
    queryKey: ["usage-series", params],
    queryFn: () => api.get<{ data: UsagePoint[] }>(withQuery("/v1/usage/series", params)),
  });
}

export type { UsageBucket };

/** Latency percentiles, errors and tokens of one bucket or one adapter (GET /v1/usage/latency, /top_adapters). */
export interface LatencyFigures {
  requests: number;
  errors: number;
  error_rate: number;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  duration_p50_ms: number;
  duration_p95_ms: number;
  ttft_p50_ms: number | null;
  ttft_p95_ms: number | null;
}

export interface LatencyPoint extends LatencyFigures {
  start: string;
}

export interface AdapterLatency extends LatencyFigures {
  tenant: string;
  adapter: string;
}

/** One adapter's latency per hour or day, the caller's tenant only. */
export function useLatencySeries(params: { adapter: string; granularity: "hour" | "day"; start: string }) {
  const api = useApi();
  return useQuery({
    queryKey: ["usage-latency", params],
    queryFn: () => api.get<{ data: LatencyPoint[] }>(withQuery("/v1/usage/latency", params)),
  });
}

/** The slowest or most failing adapters since `start`: the caller's tenant's, or every tenant's for the operator. */
export function useTopAdapters(params: { order: "latency" | "errors"; start: string; all_tenants: boolean }, enabled = true) {
  const api = useApi();
  return useQuery({
    queryKey: ["usage-top", params],
    queryFn: () => api.get<{ data: AdapterLatency[] }>(withQuery("/v1/usage/top_adapters", { ...params, limit: 10 })),
    enabled,
    refetchInterval: 10_000,
  });
}

/** The tenant's files by id, for showing names where the API gives ids (jobs). */
export function useFileNames() {
  const api = useApi();
  return useQuery({
    queryKey: ["files", "names"],
    queryFn: () => allPages<FileObject>(api, "/v1/files", (page) => page.data[page.data.length - 1].id),
    select: (files) => new Map(files.map((file) => [file.id, file.filename])),
  });
}

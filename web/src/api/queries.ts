// Query keys and fetchers shared by pages, so a change on one page refreshes the others.
import { useQuery } from "@tanstack/react-query";
import { useApi } from "../session";
import { type Api, withQuery } from "./client";
import type { Adapter, Page, UsageBucket } from "./types";

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

// Fetchers shared by pages; their keys are in queryKeys.ts, so a change on one page refreshes the others.
import { useQuery } from "@tanstack/react-query";
import { useApi } from "../session";
import { ok } from "./client";
import { queryKeys } from "./queryKeys";
import type { Page } from "./types";

/** The most a list route answers at once. */
const PAGE_SIZE = 100;

/** Every page of a cursor-paginated list (the console's lists are small enough to hold whole): `fetchPage`
 * gets the cursor (undefined for the first page) and the page size; `cursor` reads the next cursor off a page. */
export async function allPages<P extends Page<unknown>, Cursor = string>(
  fetchPage: (after: Cursor | undefined, limit: number) => Promise<P>,
  cursor: (page: P) => Cursor | undefined,
): Promise<P["data"][number][]> {
  const items: P["data"][number][] = [];
  let after: Cursor | undefined;
  for (;;) {
    const page = await fetchPage(after, PAGE_SIZE);
    items.push(...page.data);
    if (!page.has_more || page.data.length === 0) return items;
    after = cursor(page);
  }
}

/** The cursor of lists that page by their own `last_id`. */
export function lastIdOf(page: Page<unknown>): string | undefined {
  return page.last_id ?? undefined;
}

/** The cursor of lists that page by the last item's id. */
export function lastId(page: Page<{ id: string }>): string | undefined {
  return page.data[page.data.length - 1]?.id;
}

export function useAdapters() {
  const api = useApi();
  return useQuery({
    queryKey: queryKeys.adapters.all,
    queryFn: () => allPages((after, limit) => ok(api.http.GET("/v1/adapters", { params: { query: { after, limit } } })), lastIdOf),
  });
}

export function useEngineStatus(refetchInterval: number | false = false) {
  const api = useApi();
  return useQuery({
    queryKey: queryKeys.engineStatus,
    queryFn: () => ok(api.http.GET("/v1/engine/status")),
    refetchInterval,
  });
}

/** Per-adapter request and token counts in time buckets (GET /v1/usage/series). */
export function useUsageSeries(params: { adapter?: string; granularity: "hour" | "day"; start: string }) {
  const api = useApi();
  return useQuery({
    queryKey: queryKeys.usage.series(params),
    queryFn: () => ok(api.http.GET("/v1/usage/series", { params: { query: params } })),
  });
}

/** One adapter's latency per hour or day, the caller's tenant only. */
export function useLatencySeries(params: { adapter: string; granularity: "hour" | "day"; start: string }) {
  const api = useApi();
  return useQuery({
    queryKey: queryKeys.usage.latency(params),
    queryFn: () => ok(api.http.GET("/v1/usage/latency", { params: { query: params } })),
  });
}

/** The slowest or most failing adapters since `start`: the caller's tenant's, or every tenant's for the operator. */
export function useTopAdapters(params: { order: "latency" | "errors"; start: string; all_tenants: boolean }, enabled = true) {
  const api = useApi();
  return useQuery({
    queryKey: queryKeys.usage.top(params),
    queryFn: () => ok(api.http.GET("/v1/usage/top_adapters", { params: { query: { ...params, limit: 10 } } })),
    enabled,
    refetchInterval: 10_000,
  });
}

/** The tenant's files by id, for showing names where the API gives ids (jobs). */
export function useFileNames() {
  const api = useApi();
  return useQuery({
    queryKey: queryKeys.files.names,
    queryFn: () => allPages((after, limit) => ok(api.http.GET("/v1/files", { params: { query: { after, limit } } })), lastId),
    select: (files) => new Map(files.map((file) => [file.id, file.filename])),
  });
}

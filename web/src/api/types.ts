// The API objects the console reads, by the names the pages use: each is a schema of the server's OpenAPI
// document, from which schema.d.ts is generated (`make web-types`), so none is written by hand here.
import type { components } from "./schema";

type Schemas = components["schemas"];

export type Role = Schemas["ApiKeyRole"];
export type Me = Schemas["MeObject"];
export type Adapter = Schemas["AdapterObject"];
/** The listing's summary of the version `latest` points at. */
export type LatestVersionSummary = Schemas["LatestVersionSummary"];
export type VersionFile = Schemas["VersionFile"];
export type Version = Schemas["VersionObject"];
export type VersionPage = Schemas["VersionList"];
export type AliasMove = Schemas["AliasHistoryEntry"];
/** One alias: the version it names, or the versions it splits its requests between with their weights. */
export type AliasState = Schemas["AliasObject"];
export type Model = Schemas["ModelCard"];
export type Key = Schemas["KeyObject"];
export type CreatedKey = Schemas["CreatedKey"];
export type Tenant = Schemas["TenantObject"];
/** GET /v1/usage: a tenant's metered tokens, grouped. */
export type UsageReport = Schemas["UsageReport"];
export type UsageBucket = Schemas["UsageBucket"];
export type FileObject = Schemas["FileObject"];
export type Job = Schemas["JobObject"];
export type JobEvent = Schemas["EventObject"];
export type Checkpoint = Schemas["CheckpointObject"];
/** A tenant's rate limits and quotas (GET/PUT /v1/tenants/{tenant}/limits); null is unlimited. */
export type TenantLimits = Schemas["TenantLimitsObject"];
export type TenantLimitsBody = Schemas["TenantLimitsBody"];
/** The caller's tenant's view: its own requests and resident adapters; `server` for the operator only. */
export type EngineStatus = Schemas["EngineStatus"];
/** The whole engine, every tenant's load: only in the operator's view. */
export type ServerEngineStatus = Schemas["ServerEngineStatus"];
export type Residency = Schemas["ResidentAdapter"];
/** Speculative decoding's drafts and how many of their tokens one model agreed with. */
export type ModelSpeculation = Schemas["ModelSpeculation"];
/** Per-adapter request and token counts in one time bucket (GET /v1/usage/series). */
export type UsagePoint = Schemas["SeriesPointObject"];
/** Latency percentiles, errors and tokens of one bucket (GET /v1/usage/latency). */
export type LatencyPoint = Schemas["LatencyPointObject"];
/** The same figures for one adapter over a period (GET /v1/usage/top_adapters). */
export type AdapterLatency = Schemas["AdapterLatencyObject"];
/** What the figures of a bucket and of an adapter share. */
export type LatencyFigures = Omit<LatencyPoint, "start">;

/** What every cursor-paginated list answers. */
export interface Page<T> {
  data: T[];
  has_more: boolean;
  last_id?: string | null;
}

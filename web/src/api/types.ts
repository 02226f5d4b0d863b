// The API objects the console reads, as the OpenAPI document (/openapi.json) describes them.

export type Role = "admin" | "developer" | "inference";

export interface Me {
  key_id: string;
  key_name: string;
  key_prefix: string;
  role: Role;
  tenant_id: string;
  tenant: string;
  operator: boolean;
}

export interface Page<T> {
  object: "list";
  data: T[];
  has_more: boolean;
  last_id?: string | null;
}

/** The listing's summary of the version `latest` points at. */
export interface LatestVersionSummary {
  version: number;
  rank: number;
  alpha: number;
  target_modules: string[];
  size_bytes: number;
}

export interface Adapter {
  id: string;
  name: string;
  description: string;
  tags: string[];
  aliases: Record<string, number>;
  latest_version: LatestVersionSummary | null;
  created_at: string;
  updated_at: string;
}

export interface VersionFile {
  filename: string;
  sha256: string;
  size_bytes: number;
}

export interface Version {
  id: string;
  adapter: string;
  version: number;
  status: string;
  base_model: string;
  declared_base_model: string | null;
  base_model_warning: string | null;
  rank: number;
  alpha: number;
  target_modules: string[];
  dtype: string;
  source: string;
  training_job_id: string | null;
  files: VersionFile[];
  aliases: string[];
  created_at: string;
  created_by_key_id: string | null;
}

export interface AliasMove {
  from_version: number | null;
  to_version: number | null;
  changed_at: string;
  changed_by_key_id: string | null;
}

export interface Model {
  id: string;
  parent: string | null;
}

export interface Key {
  id: string;
  name: string;
  prefix: string;
  role: Role;
  tenant_id: string;
  created_at: string;
  expires_at: string | null;
  revoked_at: string | null;
  last_used_at: string | null;
}

export interface CreatedKey extends Key {
  key: string;
}

export interface Tenant {
  id: string;
  name: string;
  created_at: string;
  suspended_at: string | null;
}

/** GET /v1/usage: a tenant's metered tokens, grouped. */
export interface UsageReport {
  tenant: string;
  data: UsageBucket[];
}

export interface FileObject {
  id: string;
  filename: string;
  bytes: number;
  created_at: number;
  purpose: string;
  [field: string]: unknown;
}

export interface Job {
  id: string;
  created_at: number;
  finished_at: number | null;
  model: string;
  fine_tuned_model: string | null;
  status: string;
  hyperparameters: Record<string, unknown>;
  training_file: string;
  validation_file: string | null;
  trained_tokens: number | null;
  error: { code: string; message: string; param: string | null } | null;
  seed: number;
  suffix: string;
  attempts: number;
  max_attempts: number;
  metrics: Record<string, unknown> | null;
}

export interface JobEvent {
  id: string;
  created_at: number;
  level: string;
  message: string;
  type: string;
  data: Record<string, unknown> | null;
}

export interface Checkpoint {
  id: string;
  created_at: number;
  fine_tuned_model_checkpoint: string;
  step_number: number;
  metrics: Record<string, unknown>;
}

export interface UsageBucket {
  adapter?: string | null;
  day?: string | null;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  errors: number;
  aborted: number;
  mean_time_to_first_token_ms: number | null;
  mean_duration_ms: number;
}

/** A tenant's rate limits and quotas (GET/PUT /v1/tenants/{tenant}/limits); null is unlimited. */
export interface TenantLimits {
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  max_concurrent_requests: number | null;
  max_training_jobs: number | null;
  monthly_tokens: number | null;
  share_weight: number;
}

// Every TanStack Query key the console uses. A key is a path: invalidating a prefix (`adapters.all`)
// refreshes every query under it (one adapter, its versions, its aliases' history), which is how a change
// on one page refreshes the others. Keep them here, so that a page's key and another's invalidation agree.

export const queryKeys = {
  me: (key: string) => ["me", key] as const,
  adapters: {
    all: ["adapters"] as const,
    one: (name: string) => ["adapters", name] as const,
    versions: (name: string) => ["adapters", name, "versions"] as const,
    alias: (name: string, alias: string) => ["adapters", name, "aliases", alias] as const,
    aliasHistory: (name: string, alias: string) => ["adapters", name, "aliases", alias, "history"] as const,
  },
  models: {
    all: ["models"] as const,
    withVersions: ["models", "with-versions"] as const,
  },
  keys: {
    all: ["keys"] as const,
    /** One tenant's keys; null: the caller's own tenant. */
    of: (tenant: string | null) => ["keys", tenant] as const,
  },
  tenants: {
    all: ["tenants"] as const,
    limits: (tenant: string) => ["tenants", tenant, "limits"] as const,
  },
  files: {
    all: ["files"] as const,
    /** The datasets a job may train on. */
    fineTune: ["files", "fine-tune"] as const,
    /** Every file's name by id. */
    names: ["files", "names"] as const,
  },
  jobs: {
    all: ["jobs"] as const,
    one: (id: string) => ["jobs", id] as const,
    // With the job's status: each change of status fetches them again.
    events: (id: string, status: string | undefined) => ["jobs", id, "events", status] as const,
    checkpoints: (id: string, status: string | undefined) => ["jobs", id, "checkpoints", status] as const,
    /** What a job of this create body would train and how long (the rate follows the jobs that finish). */
    estimate: (body: object) => ["jobs", "estimate", body] as const,
  },
  engineStatus: ["engine-status"] as const,
  usage: {
    byAdapter: (tenant: string, start: string) => ["usage", tenant, "adapter", start] as const,
    /** The caller's tenant's usage per adapter, alias and the version that served, since `start` (a canary's figures). */
    byAliasVersion: (start: string) => ["usage", "alias-version", start] as const,
    series: (params: object) => ["usage", "series", params] as const,
    latency: (params: object) => ["usage", "latency", params] as const,
    top: (params: object) => ["usage", "top", params] as const,
  },
};

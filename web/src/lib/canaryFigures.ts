// A canary's figures side by side: each version of an alias's split, from GET /v1/usage?group_by=alias_version
// (the requests that named the alias, by the version that served them) since the split began. A version with no request yet gets zeros, not a missing column.
import type { UsageBucket } from "../api/types";

export interface VersionFigures {
  version: number;
  requests: number;
  errors: number;
  errorRate: number | null;
  totalTokens: number;
  meanTtftMs: number | null;
  meanDurationMs: number | null;
}

export function canaryFigures(buckets: UsageBucket[], adapter: string, alias: string, versions: number[]): VersionFigures[] {
  return [...versions].sort((a, b) => a - b).map((version) => {
    const bucket = buckets.find((entry) => entry.adapter === adapter && entry.alias === alias && entry.version === version);
    if (!bucket || bucket.requests === 0) {
      return { version, requests: 0, errors: 0, errorRate: null, totalTokens: 0, meanTtftMs: null, meanDurationMs: null };
    }
    return {
      version,
      requests: bucket.requests,
      errors: bucket.errors,
      errorRate: bucket.errors / bucket.requests,
      totalTokens: bucket.total_tokens,
      meanTtftMs: bucket.mean_time_to_first_token_ms ?? null,
      meanDurationMs: bucket.mean_duration_ms,
    };
  });
}

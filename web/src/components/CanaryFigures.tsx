// A canary's versions side by side since its split began: each version's share, requests, errors,
// tokens and mean latencies over the requests that named the alias (GET /v1/usage?group_by=alias_version), so the new version can be compared with
// the stable one before it is promoted or rolled back.
import { useQuery } from "@tanstack/react-query";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import { canaryFigures } from "../lib/canaryFigures";
import { formatDate, formatNumber } from "../lib/format";
import { percentages, type Share } from "../lib/split";
import { useApi } from "../session";
import { ErrorBox } from "./States";

const REFRESH_MS = 10_000;
const decimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

function ms(value: number | null): string {
  return value === null ? "—" : `${decimal.format(value)} ms`;
}

export function CanaryFigures({ adapter, alias, split, since }: { adapter: string; alias: string; split: Share[]; since: string }) {
  const api = useApi();
  const start = new Date(since).toISOString();
  const usage = useQuery({
    queryKey: queryKeys.usage.byAliasVersion(start),
    queryFn: () => ok(api.http.GET("/v1/usage", { params: { query: { group_by: "alias_version", start } } })),
    refetchInterval: REFRESH_MS,
  });
  const versions = split.map((share) => share.version).sort((a, b) => a - b);
  const figures = canaryFigures(usage.data?.data ?? [], adapter, alias, versions);
  const shares = new Map(percentages(split).map((share) => [share.version, share.percent]));
  const rows: [string, (index: number) => string][] = [
    ["Share", (i) => `${decimal.format(shares.get(figures[i].version) ?? 0)}%`],
    ["Requests", (i) => formatNumber(figures[i].requests)],
    ["Errors", (i) => (figures[i].errorRate === null ? "0" : `${formatNumber(figures[i].errors)} (${decimal.format(100 * figures[i].errorRate!)}%)`)],
    ["Tokens", (i) => formatNumber(figures[i].totalTokens)],
    ["Mean time to first token", (i) => ms(figures[i].meanTtftMs)],
    ["Mean duration", (i) => ms(figures[i].meanDurationMs)],
  ];
  return (
    <div className="canary">
      <ErrorBox error={usage.error} />
      <table aria-label={`${alias} versions side by side`}>
        <caption className="muted">Since the split began, {formatDate(since)} (the requests that named this alias).</caption>
        <thead>
          <tr><th scope="col">Figure</th>{figures.map((f) => <th scope="col" key={f.version}>v{f.version}</th>)}</tr>
        </thead>
        <tbody>
          {rows.map(([label, cell]) => (
            <tr key={label}>
              <th scope="row">{label}</th>
              {figures.map((f, index) => <td key={f.version} data-version={f.version}>{cell(index)}</td>)}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

// The editor of an alias's split (a canary rollout): its versions and their weights, each row's share
// in percent as it is typed, what the server would refuse said before Save (naming the row), and Save,
// which puts the whole split (PUT /v1/adapters/{name}/aliases/{alias} with `split`).
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { AliasState } from "../api/types";
import { percentages, type ShareRow, sharesOf, splitProblem, startingRows } from "../lib/split";
import { useApi } from "../session";
import { ErrorBox } from "./States";

const percent = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });

export function SplitEditor({ adapter, current, versions }: { adapter: string; current: AliasState; versions: number[] }) {
  const api = useApi();
  const client = useQueryClient();
  const alias = current.alias;
  const [rows, setRows] = useState<ShareRow[]>(() => startingRows(current, versions));
  const save = useMutation({
    mutationFn: () => ok(api.http.PUT("/v1/adapters/{name}/aliases/{alias}", {
      params: { path: { name: adapter, alias } }, body: { split: sharesOf(rows) },
    })),
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.adapters.all }),
  });
  const problem = splitProblem(rows);
  const shares = problem === null ? percentages(sharesOf(rows)) : null;
  const change = (index: number, row: Partial<ShareRow>) => setRows(rows.map((old, at) => (at === index ? { ...old, ...row } : old)));
  const unused = [...versions].sort((a, b) => b - a).find((version) => !rows.some((row) => row.version === version));
  return (
    <div role="group" aria-label={`Split ${alias}`} className="split-editor">
      <table>
        <thead>
          <tr><th>Version</th><th>Weight</th><th>Share</th><th /></tr>
        </thead>
        <tbody>
          {rows.map((row, index) => (
            <tr key={index}>
              <td>
                <select aria-label={`Version of row ${index + 1}`} value={row.version}
                  onChange={(event) => change(index, { version: Number(event.target.value) })}>
                  {[...versions].sort((a, b) => b - a).map((version) => <option key={version} value={version}>v{version}</option>)}
                </select>
              </td>
              <td>
                <input aria-label={`Weight of row ${index + 1}`} type="number" min={1} step={1} size={6} value={row.weight}
                  onChange={(event) => change(index, { weight: event.target.value })} />
              </td>
              <td data-testid={`share-${index + 1}`}>{shares ? `${percent.format(shares[index].percent)}%` : "—"}</td>
              <td>
                {rows.length > 2 && (
                  <button type="button" aria-label={`Remove row ${index + 1}`} onClick={() => setRows(rows.filter((_, at) => at !== index))}>
                    Remove
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <button type="button" disabled={unused === undefined} onClick={() => unused !== undefined && setRows([...rows, { version: unused, weight: "10" }])}>
        Add version
      </button>{" "}
      <button type="button" className="primary" disabled={problem !== null || save.isPending} onClick={() => save.mutate()}>
        Save split
      </button>
      {problem && <p className="muted" role="note">{problem}</p>}
      <p className="help">
        A request with a <code>user</code> keeps its version while the split stays the same; one without draws by weight each time.
      </p>
      <ErrorBox error={save.error} />
    </div>
  );
}

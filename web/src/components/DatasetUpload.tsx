// A dataset's upload (POST /v1/files, purpose fine-tune). The server checks every line before it
// stores anything: an accepted file shows the format it was read as (chat, instruction, text, or
// preference for DPO) with its counts; a refused one its line-numbered report.
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { type FormEvent, useState } from "react";
import { ApiError } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { FileObject } from "../api/types";
import { formatNumber } from "../lib/format";
import { useApi } from "../session";
import { ErrorBox } from "./States";

interface ReportLine {
  line: number | null;
  reason: string;
  message: string;
  param: string | null;
}

/** What a job of each method trains on, by the format the upload check names. */
const FORMAT_USE: Record<string, string> = {
  chat: "supervised jobs",
  instruction: "supervised jobs",
  text: "supervised jobs",
  preference: "DPO jobs",
};

export function DatasetUpload() {
  const api = useApi();
  const client = useQueryClient();
  const [file, setFile] = useState<File | null>(null);
  const [progress, setProgress] = useState<number | null>(null);
  const upload = useMutation({
    mutationFn: (chosen: File) => {
      const form = new FormData();
      form.append("purpose", "fine-tune");
      form.append("file", chosen, chosen.name);
      return api.upload<FileObject>("/v1/files", form, setProgress);
    },
    onSettled: () => setProgress(null),
    onSuccess: () => client.invalidateQueries({ queryKey: queryKeys.files.all }),
  });
  const report = upload.error instanceof ApiError
    ? ((upload.error.details as { report?: { errors: ReportLine[]; num_errors: number } } | null)?.report ?? null)
    : null;
  const submit = (event: FormEvent) => {
    event.preventDefault();
    if (file) upload.mutate(file);
  };
  const accepted = upload.data;
  return (
    <form onSubmit={submit} aria-label="Upload a dataset" className="card">
      <h2>Dataset</h2>
      <p className="muted">
        JSONL: chat (<code>messages</code>), instruction (<code>prompt</code>/<code>completion</code>) or <code>text</code> lines
        for supervised jobs; for DPO, preference lines (<code>input.messages</code>, <code>preferred_output</code>,{" "}
        <code>non_preferred_output</code>).
      </p>
      <input type="file" accept=".jsonl,.json,.txt" aria-label="Dataset file" onChange={(event) => setFile(event.target.files?.[0] ?? null)} />
      <button type="submit" className="primary" disabled={!file || upload.isPending}>Upload dataset</button>
      {progress !== null && <progress aria-label="Dataset upload progress" max={1} value={progress} />}
      {accepted && (
        <p role="status" className="ok">
          {accepted.filename} accepted as <code>{accepted.id}</code>: <span data-testid="dataset-format">{accepted.format}</span> format
          {FORMAT_USE[accepted.format] && ` (for ${FORMAT_USE[accepted.format]})`}, {formatNumber(accepted.line_count)} examples,{" "}
          {formatNumber(accepted.token_count)} tokens.
        </p>
      )}
      <ErrorBox error={upload.error} title="Refused" />
      {report && (
        <table aria-label="Dataset validation report">
          <thead>
            <tr><th>Line</th><th>Reason</th><th>Where</th><th>Message</th></tr>
          </thead>
          <tbody>
            {report.errors.map((error, index) => (
              <tr key={index}>
                <td>{error.line ?? "file"}</td>
                <td><code>{error.reason}</code></td>
                <td>{error.param ?? "—"}</td>
                <td>{error.message}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </form>
  );
}

import { useQueryClient } from "@tanstack/react-query";
import { type FormEvent, useState } from "react";
import { Link } from "react-router-dom";
import type { ApiError } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import type { Version } from "../api/types";
import { DropZone } from "../components/DropZone";
import { ErrorBox } from "../components/States";
import { adapterFiles, suggestedName } from "../lib/dropped";
import { formatBytes } from "../lib/format";
import { useApi } from "../session";

type State =
  | { step: "idle" }
  | { step: "uploading"; progress: number }
  | { step: "done"; version: Version }
  | { step: "failed"; error: ApiError | Error };

export function UploadPage() {
  const api = useApi();
  const client = useQueryClient();
  const [files, setFiles] = useState<File[]>([]);
  const [name, setName] = useState("");
  const [state, setState] = useState<State>({ step: "idle" });

  const choose = (picked: File[], source: string) => {
    setFiles(adapterFiles(picked));
    if (!name && source) setName(suggestedName(source));
    setState({ step: "idle" });
  };
  const submit = async (event: FormEvent) => {
    event.preventDefault();
    const form = new FormData();
    for (const file of files) form.append("files", file, file.name);
    setState({ step: "uploading", progress: 0 });
    try {
      const version = await api.upload<Version>(`/v1/adapters/${encodeURIComponent(name)}/versions`, form, (progress) =>
        setState({ step: "uploading", progress }),
      );
      setState({ step: "done", version });
      await client.invalidateQueries({ queryKey: queryKeys.adapters.all });
    } catch (error) {
      setState({ step: "failed", error: error as Error });
    }
  };

  return (
    <section>
      <h1>Upload an adapter</h1>
      <p className="muted">
        A PEFT LoRA directory (<code>adapter_config.json</code> and <code>adapter_model.safetensors</code>, and its
        own chat template if it has one: <code>chat_template.jinja</code> or <code>tokenizer_config.json</code>) or one
        .tar.gz / .zip of it. The server checks every module and shape against the served base, and renders a test
        chat with the template, before storing it.
      </p>
      <form onSubmit={submit} aria-label="Upload an adapter">
        <DropZone onFiles={choose} />
        {files.length > 0 && (
          <ul className="files" aria-label="Files to upload">
            {files.map((file) => (
              <li key={file.name}>
                <code>{file.name}</code> <span className="muted">{formatBytes(file.size)}</span>
              </li>
            ))}
            {state.step === "failed" && (
              <li className="file-error">
                <ErrorBox error={state.error} title="Refused" />
              </li>
            )}
          </ul>
        )}
        <label>
          Adapter name{" "}
          <input value={name} onChange={(event) => setName(event.target.value)} aria-label="Adapter name" required />
        </label>
        <button type="submit" className="primary" disabled={files.length === 0 || !name || state.step === "uploading"}>
          Upload
        </button>
        {state.step === "uploading" && (
          <progress aria-label="Upload progress" max={1} value={state.progress}>
            {Math.round(state.progress * 100)}%
          </progress>
        )}
        {state.step === "done" && (
          <p role="status" className="ok">
            Registered{" "}
            <Link to={`/adapters/${encodeURIComponent(state.version.adapter)}`}>
              {state.version.adapter}@{state.version.version}
            </Link>{" "}
            (rank {state.version.rank}, {state.version.target_modules.join(", ")}).
          </p>
        )}
        {state.step === "done" && state.version.base_model_warning && (
          <p role="note" className="muted">
            Warning: {state.version.base_model_warning}
          </p>
        )}
      </form>
    </section>
  );
}

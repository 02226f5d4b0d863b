import { useQuery } from "@tanstack/react-query";
import { type FormEvent, useRef, useState } from "react";
import { useSearchParams } from "react-router-dom";
import type { Model } from "../api/types";
import { streamChat } from "../api/stream";
import { ErrorBox } from "../components/States";
import { useApi } from "../session";

interface Answer {
  text: string;
  running: boolean;
  error: Error | null;
  finish: string | null;
}

const idle: Answer = { text: "", running: false, error: null, finish: null };

export function PlaygroundPage() {
  const api = useApi();
  const [params] = useSearchParams();
  const models = useQuery({
    queryKey: ["models", "with-versions"],
    queryFn: () => api.get<{ data: Model[] }>("/v1/models?include_versions=true"),
  });
  const [sideBySide, setSideBySide] = useState(params.has("compare"));
  const [references, setReferences] = useState<[string, string]>([params.get("model") ?? "base", params.get("compare") ?? "base"]);
  const [prompt, setPrompt] = useState("Say hello in one sentence.");
  const [temperature, setTemperature] = useState(0.7);
  const [maxTokens, setMaxTokens] = useState(64);
  const [answers, setAnswers] = useState<[Answer, Answer]>([idle, idle]);
  const abort = useRef<AbortController | null>(null);

  const update = (index: number, change: (answer: Answer) => Answer) =>
    setAnswers((current) => {
      const next: [Answer, Answer] = [current[0], current[1]];
      next[index] = change(next[index]);
      return next;
    });

  const send = (event: FormEvent) => {
    event.preventDefault();
    abort.current?.abort();
    const controller = new AbortController();
    abort.current = controller;
    const count = sideBySide ? 2 : 1;
    setAnswers([{ ...idle, running: true }, { ...idle, running: count === 2 }]);
    for (let index = 0; index < count; index += 1) {
      streamChat(api, { model: references[index], prompt, temperature, maxTokens },
        (delta) => update(index, (answer) => ({ ...answer, text: answer.text + delta })), controller.signal)
        .then((finish) => update(index, (answer) => ({ ...answer, running: false, finish })))
        .catch((error: Error) => {
          // Stopped by the user: keep what arrived, show no error.
          const stopped = error.name === "AbortError";
          update(index, (answer) => ({ ...answer, running: false, error: stopped ? null : error }));
        });
    }
  };
  const running = answers.some((answer) => answer.running);

  return (
    <section>
      <h1>Playground</h1>
      <form onSubmit={send} aria-label="Playground" className="playground-form">
        <datalist id="references">
          {(models.data?.data ?? []).map((model) => (
            <option key={model.id} value={model.id} />
          ))}
        </datalist>
        <div className="row">
          <label>
            Model{" "}
            <input list="references" aria-label="Model reference" value={references[0]} size={28}
              onChange={(event) => setReferences([event.target.value, references[1]])} />
          </label>
          {sideBySide && (
            <label>
              versus{" "}
              <input list="references" aria-label="Second model reference" value={references[1]} size={28}
                onChange={(event) => setReferences([references[0], event.target.value])} />
            </label>
          )}
          <label className="inline">
            <input type="checkbox" checked={sideBySide} onChange={(event) => setSideBySide(event.target.checked)} />
            Side by side
          </label>
        </div>
        <p className="muted">
          Any reference: <code>base</code>, <code>name</code>, <code>name:alias</code>, <code>name@N</code>, or a
          checkpoint id.
        </p>
        <ErrorBox error={models.error} title="Models" />
        <div className="row">
          <label>
            Temperature{" "}
            <input type="number" aria-label="Temperature" min={0} max={2} step={0.1} value={temperature}
              onChange={(event) => setTemperature(Number(event.target.value))} />
          </label>
          <label>
            Max tokens{" "}
            <input type="number" aria-label="Max tokens" min={1} max={4096} value={maxTokens}
              onChange={(event) => setMaxTokens(Number(event.target.value))} />
          </label>
        </div>
        <label htmlFor="prompt">Prompt</label>
        <textarea id="prompt" rows={4} value={prompt} onChange={(event) => setPrompt(event.target.value)} />
        <div className="row">
          <button type="submit" className="primary" disabled={!prompt.trim()}>Send</button>
          {running && <button type="button" onClick={() => abort.current?.abort()}>Stop</button>}
        </div>
      </form>
      <div className={sideBySide ? "answers two" : "answers"}>
        {answers.slice(0, sideBySide ? 2 : 1).map((answer, index) => (
          <article key={index} aria-label={`Answer from ${references[index]}`} className="answer">
            <h2>{references[index]}</h2>
            <ErrorBox error={answer.error} />
            <pre data-testid={`answer-${index}`} aria-busy={answer.running}>{answer.text}</pre>
            {answer.running && <span className="muted" role="status">streaming…</span>}
            {answer.finish && (
              <span className="muted" data-testid={`finish-${index}`}>
                finished: {answer.finish}{answer.text ? "" : " (no text: the model ended at once)"}
              </span>
            )}
          </article>
        ))}
      </div>
    </section>
  );
}

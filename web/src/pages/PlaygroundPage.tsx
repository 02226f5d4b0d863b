// A chat with any model reference: a system prompt, several turns, an optional second model answering
// the same questions side by side, each answer's latency and tokens, and the conversation as code.
import { useQuery } from "@tanstack/react-query";
import { type FormEvent, useRef, useState } from "react";
import { useSearchParams } from "react-router-dom";
import { ok } from "../api/client";
import { queryKeys } from "../api/queryKeys";
import { streamChat } from "../api/stream";
import { CopyAsCode } from "../components/CopyAsCode";
import { ErrorBox } from "../components/States";
import { type Answer, EMPTY_ANSWER, messagesFor, type Turn } from "../lib/conversation";
import { formatNumber } from "../lib/format";
import { formatMs } from "../lib/latency";
import { useApi } from "../session";

export function PlaygroundPage() {
  const api = useApi();
  const [params] = useSearchParams();
  const models = useQuery({
    queryKey: queryKeys.models.withVersions,
    queryFn: () => ok(api.http.GET("/v1/models", { params: { query: { include_versions: true } } })),
  });
  const [sideBySide, setSideBySide] = useState(params.has("compare"));
  const [references, setReferences] = useState<[string, string]>([params.get("model") ?? "base", params.get("compare") ?? "base"]);
  const [system, setSystem] = useState("");
  const [prompt, setPrompt] = useState("Say hello in one sentence.");
  const [temperature, setTemperature] = useState(0.7);
  const [maxTokens, setMaxTokens] = useState(64);
  const [turns, setTurns] = useState<Turn[]>([]);
  const abort = useRef<AbortController | null>(null);
  const sides = sideBySide ? 2 : 1;

  const updateAnswer = (turnIndex: number, side: number, change: (answer: Answer) => Answer) =>
    setTurns((current) => current.map((turn, index) => (index !== turnIndex ? turn : {
      ...turn, answers: turn.answers.map((answer, at) => (at === side ? change(answer) : answer)),
    })));

  const send = (event: FormEvent) => {
    event.preventDefault();
    abort.current?.abort();
    const controller = new AbortController();
    abort.current = controller;
    const question = prompt;
    const turnIndex = turns.length;
    const history = turns;
    setTurns([...turns, { user: question, answers: Array.from({ length: sides }, () => ({ ...EMPTY_ANSWER, running: true })) }]);
    setPrompt("");
    for (let side = 0; side < sides; side += 1) {
      const request = { model: references[side], messages: messagesFor(system, history, side, question), temperature, maxTokens };
      streamChat(api, request, (delta) => updateAnswer(turnIndex, side, (answer) => ({ ...answer, text: answer.text + delta })),
        controller.signal)
        .then((result) => updateAnswer(turnIndex, side, (answer) => ({
          ...answer, running: false, finish: result.finishReason, ttftMs: result.ttftMs, totalMs: result.totalMs,
          promptTokens: result.usage?.prompt_tokens ?? null, completionTokens: result.usage?.completion_tokens ?? null,
        })))
        .catch((error: Error) => {
          // Stopped by the user: keep what arrived, show no error.
          const stopped = error.name === "AbortError";
          updateAnswer(turnIndex, side, (answer) => ({ ...answer, running: false, error: stopped ? null : error.message }));
        });
    }
  };
  const running = turns.some((turn) => turn.answers.some((answer) => answer.running));
  const startOver = () => {
    abort.current?.abort();
    setTurns([]);
  };
  const modelIds = (models.data?.data ?? []).map((model) => model.id);

  return (
    <section>
      <h1>Playground</h1>
      <form onSubmit={send} aria-label="Playground" className="playground-form">
        <datalist id="references">
          {modelIds.map((id) => <option key={id} value={id} />)}
        </datalist>
        <div className="row">
          <label>
            Model{" "}
            <input list="references" aria-label="Model reference" value={references[0]} size={28}
              onChange={(event) => setReferences([event.target.value, references[1]])} />
          </label>
          <label>
            or pick{" "}
            <select aria-label="Pick a model" value={modelIds.includes(references[0]) ? references[0] : ""}
              onChange={(event) => event.target.value && setReferences([event.target.value, references[1]])}>
              <option value="">{models.isPending ? "loading models…" : `${modelIds.length} models`}</option>
              {modelIds.map((id) => <option key={id} value={id}>{id}</option>)}
            </select>
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
          checkpoint id. The list comes from <code>/v1/models</code>.
        </p>
        <ErrorBox error={models.error} title="Models" />
        {/* "System message", OpenAI's name for the system prompt: a label holding "prompt" would also
            answer to the Prompt box's label. */}
        <label htmlFor="system">System message</label>
        <textarea id="system" rows={2} value={system} placeholder="optional: the system prompt, how the model should behave"
          onChange={(event) => setSystem(event.target.value)} />
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
        <Conversation turns={turns} references={references} sides={sides} />
        <label htmlFor="prompt">Prompt</label>
        <textarea id="prompt" rows={3} value={prompt} onChange={(event) => setPrompt(event.target.value)} />
        <div className="row">
          <button type="submit" className="primary" disabled={!prompt.trim() || running}>Send</button>
          {running && <button type="button" onClick={() => abort.current?.abort()}>Stop</button>}
          {turns.length > 0 && <button type="button" onClick={startOver}>New conversation</button>}
        </div>
      </form>
      <CopyAsCode
        call={{
          baseUrl: window.location.origin,
          model: references[0],
          messages: messagesFor(system, turns, 0, prompt.trim() ? prompt : undefined),
          temperature,
          maxTokens,
        }}
      />
    </section>
  );
}

function Conversation({ turns, references, sides }: { turns: Turn[]; references: [string, string]; sides: number }) {
  if (turns.length === 0) return null;
  const last = turns.length - 1;
  return (
    <div className={sides === 2 ? "answers two" : "answers"}>
      {references.slice(0, sides).map((reference, side) => (
        <article key={side} aria-label={`Answer from ${reference}`} className="answer">
          <h2>{reference}</h2>
          <ol className="turns" aria-label={`Conversation with ${reference}`}>
            {turns.map((turn, index) => {
              const answer = turn.answers[side] ?? EMPTY_ANSWER;
              // The latest answer keeps the test ids the single-turn playground had.
              const latest = index === last;
              return (
                <li key={index}>
                  <p className="user-turn"><strong>You:</strong> {turn.user}</p>
                  <ErrorBox error={answer.error === null ? null : new Error(answer.error)} />
                  <pre data-testid={latest ? `answer-${side}` : undefined} aria-busy={answer.running}>{answer.text}</pre>
                  {answer.running && <span className="muted" role="status">streaming…</span>}
                  {answer.finish && (
                    <p className="muted readout" data-testid={latest ? `finish-${side}` : undefined}>
                      finished: {answer.finish}{answer.text ? "" : " (no text: the model ended at once)"} ·{" "}
                      <span data-testid={latest ? `latency-${side}` : undefined}>
                        first token {formatMs(answer.ttftMs)}, total {formatMs(answer.totalMs)}
                      </span>{" "}
                      · <span data-testid={latest ? `tokens-${side}` : undefined}>
                        {formatNumber(answer.promptTokens)} prompt + {formatNumber(answer.completionTokens)} completion tokens
                      </span>
                    </p>
                  )}
                </li>
              );
            })}
          </ol>
        </article>
      ))}
    </div>
  );
}

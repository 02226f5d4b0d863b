// Streams a chat completion (OpenAI SSE) and hands each text delta to the caller as it arrives; times
// the first token and the whole answer as the browser saw them, and reads the final usage chunk.
import { createParser } from "eventsource-parser";
import type { ChatMessage } from "../lib/copyAs";
import { type Api, errorFromBody } from "./client";

export interface ChatRequest {
  model: string;
  messages: ChatMessage[];
  temperature: number;
  maxTokens: number;
}

export interface ChatUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

export interface ChatResult {
  finishReason: string | null;
  usage: ChatUsage | null;
  ttftMs: number | null; // request sent -> first text; null when no text came
  totalMs: number; // request sent -> stream ended
}

interface ChunkBody {
  choices?: { delta?: { content?: string | null }; finish_reason?: string | null }[];
  usage?: ChatUsage | null;
  error?: { message?: string };
}

/** Streams `request` and calls onDelta with each piece of text. */
export async function streamChat(
  api: Api,
  request: ChatRequest,
  onDelta: (text: string) => void,
  signal?: AbortSignal,
): Promise<ChatResult> {
  const sent = performance.now();
  const response = await fetch(`${api.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: api.headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({
      model: request.model,
      messages: request.messages,
      temperature: request.temperature,
      max_tokens: request.maxTokens,
      stream: true,
      stream_options: { include_usage: true },
    }),
    signal,
  });
  if (!response.ok || response.body === null) throw errorFromBody(response.status, await response.text());
  let failure: string | null = null;
  let finishReason: string | null = null;
  let usage: ChatUsage | null = null;
  let ttftMs: number | null = null;
  const parser = createParser({
    onEvent(event) {
      if (event.data === "[DONE]") return;
      const chunk = JSON.parse(event.data) as ChunkBody;
      // An error after the stream started arrives as an event, not a status code.
      if (chunk.error?.message) failure = chunk.error.message;
      if (chunk.usage) usage = chunk.usage;
      const text = chunk.choices?.[0]?.delta?.content;
      if (text) {
        ttftMs ??= performance.now() - sent;
        onDelta(text);
      }
      finishReason = chunk.choices?.[0]?.finish_reason ?? finishReason;
    },
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parser.feed(value);
  }
  if (failure !== null) throw new Error(failure);
  return { finishReason, usage, ttftMs, totalMs: performance.now() - sent };
}

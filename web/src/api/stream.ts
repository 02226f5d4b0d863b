// Streams a chat completion (OpenAI SSE) and hands each text delta to the caller as it arrives.
import { createParser } from "eventsource-parser";
import { type Api, errorFromBody } from "./client";

export interface ChatRequest {
  model: string;
  prompt: string;
  temperature: number;
  maxTokens: number;
}

interface ChunkBody {
  choices?: { delta?: { content?: string | null }; finish_reason?: string | null }[];
  error?: { message?: string };
}

/** Streams `request` and calls onDelta with each piece of text; resolves with the finish reason. */
export async function streamChat(
  api: Api,
  request: ChatRequest,
  onDelta: (text: string) => void,
  signal?: AbortSignal,
): Promise<string | null> {
  const response = await fetch(`${api.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: api.headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({
      model: request.model,
      messages: [{ role: "user", content: request.prompt }],
      temperature: request.temperature,
      max_tokens: request.maxTokens,
      stream: true,
    }),
    signal,
  });
  if (!response.ok || response.body === null) throw errorFromBody(response.status, await response.text());
  let failure: string | null = null;
  let finishReason: string | null = null;
  const parser = createParser({
    onEvent(event) {
      if (event.data === "[DONE]") return;
      const chunk = JSON.parse(event.data) as ChunkBody;
      // An error after the stream started arrives as an event, not a status code.
      if (chunk.error?.message) failure = chunk.error.message;
      const text = chunk.choices?.[0]?.delta?.content;
      if (text) onDelta(text);
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
  return finishReason;
}

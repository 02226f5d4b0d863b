// A playground conversation: the user's turns are shared by every side of a comparison, and each side
// keeps its own answers, so each model is asked with its own earlier replies, as a real chat would be.
import type { ChatMessage } from "./copyAs";

export interface Answer {
  text: string;
  running: boolean;
  error: string | null;
  finish: string | null;
  ttftMs: number | null;
  totalMs: number | null;
  promptTokens: number | null;
  completionTokens: number | null;
}

export interface Turn {
  user: string;
  answers: Answer[]; // one per side
}

export const EMPTY_ANSWER: Answer = {
  text: "", running: false, error: null, finish: null, ttftMs: null, totalMs: null, promptTokens: null,
  completionTokens: null,
};

/** The messages to send for `side`: the system prompt (if any), then every turn with that side's answer;
 * a turn whose answer failed or is empty is left out with its question, so the model never sees a
 * question without its reply. `next`, if given, is the new question at the end. */
export function messagesFor(system: string, turns: Turn[], side: number, next?: string): ChatMessage[] {
  const messages: ChatMessage[] = system.trim() ? [{ role: "system", content: system }] : [];
  for (const turn of turns) {
    const answer = turn.answers[side];
    if (!answer || answer.error !== null || answer.running || !answer.text) continue;
    messages.push({ role: "user", content: turn.user }, { role: "assistant", content: answer.text });
  }
  if (next !== undefined) messages.push({ role: "user", content: next });
  return messages;
}

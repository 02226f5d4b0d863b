// The playground's conversation as code a user can run elsewhere: a curl command and a Python script
// with the openai SDK. The key is read from LORALOOM_API_KEY, never written into the code: a snippet
// pasted into a chat or a ticket must not carry a secret.

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

export interface ChatCall {
  baseUrl: string; // the server's origin, e.g. "https://llm.example.com"
  model: string;
  messages: ChatMessage[];
  temperature: number;
  maxTokens: number;
}

export const KEY_VARIABLE = "LORALOOM_API_KEY";

function body(call: ChatCall) {
  return { model: call.model, messages: call.messages, temperature: call.temperature, max_tokens: call.maxTokens };
}

/** A POSIX shell word holding `text` as it is: single quotes, each inner quote closed, escaped and reopened. */
export function shellQuote(text: string): string {
  return `'${text.replaceAll("'", `'\\''`)}'`;
}

export function curlCommand(call: ChatCall): string {
  return [
    `curl ${shellQuote(`${call.baseUrl}/v1/chat/completions`)}`,
    `  -H "Authorization: Bearer $${KEY_VARIABLE}"`,
    `  -H 'Content-Type: application/json'`,
    `  -d ${shellQuote(JSON.stringify(body(call), null, 2))}`,
  ].join(" \\\n");
}

/** A Python literal for a JSON-compatible value: JSON's strings and numbers are Python's too; the
 * three words that differ are spelled Python's way. */
export function pythonLiteral(value: unknown, indent = ""): string {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number" || typeof value === "string") return JSON.stringify(value);
  const inner = `${indent}    `;
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return `[\n${value.map((item) => inner + pythonLiteral(item, inner)).join(",\n")},\n${indent}]`;
  }
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length === 0) return "{}";
  return `{\n${entries.map(([key, item]) => `${inner}${JSON.stringify(key)}: ${pythonLiteral(item, inner)}`).join(",\n")},\n${indent}}`;
}

export function pythonScript(call: ChatCall): string {
  return [
    "import os",
    "",
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url=${JSON.stringify(`${call.baseUrl}/v1`)}, api_key=os.environ[${JSON.stringify(KEY_VARIABLE)}])`,
    "response = client.chat.completions.create(",
    `    model=${pythonLiteral(call.model)},`,
    `    messages=${pythonLiteral(call.messages, "    ")},`,
    `    temperature=${pythonLiteral(call.temperature)},`,
    `    max_tokens=${pythonLiteral(call.maxTokens)},`,
    ")",
    "print(response.choices[0].message.content)",
    "",
  ].join("\n");
}

// The pure logic of the console's operator views: latency formatting, job progress, conversations,
// and the code the playground copies.
import { describe, expect, it } from "vitest";
import { curlCommand, pythonLiteral, pythonScript, shellQuote } from "./copyAs";
import { EMPTY_ANSWER, messagesFor, type Turn } from "./conversation";
import { formatErrorRate, formatMs, formatSeconds } from "./latency";
import { jobProgress } from "./progress";

describe("latency formatting", () => {
  it("keeps milliseconds readable across the range, and says when there is no value", () => {
    expect(formatMs(null)).toBe("—");
    expect(formatMs(undefined)).toBe("—");
    expect(formatMs(3.25)).toBe("3.3 ms");
    expect(formatMs(840.4)).toBe("840 ms");
    expect(formatMs(1250)).toBe("1.25 s");
    expect(formatMs(125_000)).toBe("2 min 5 s");
  });
  it("never rounds a real error rate down to 0%", () => {
    expect(formatErrorRate(0, 10)).toBe("0%");
    expect(formatErrorRate(1, 10_000)).toBe("<0.1%");
    expect(formatErrorRate(1, 3)).toBe("33.3%");
    expect(formatErrorRate(0, 0)).toBe("—");
  });
  it("writes an ETA coarsely", () => {
    expect(formatSeconds(44.6)).toBe("45 s");
    expect(formatSeconds(200)).toBe("3 min 20 s");
    expect(formatSeconds(3900)).toBe("1 h 05 min");
    expect(formatSeconds(null)).toBe("—");
  });
});

describe("job progress", () => {
  const metrics = { step: 3, total_steps: 12, eta_seconds: 90, tokens_per_second: 512.4 };
  it("reads step, total, ETA and speed from the last reported step", () => {
    expect(jobProgress({ status: "running", metrics })).toEqual({
      step: 3, totalSteps: 12, fraction: 0.25, etaSeconds: 90, tokensPerSecond: 512.4,
    });
  });
  it("has no ETA once the job ended, and no progress before its first step", () => {
    expect(jobProgress({ status: "cancelled", metrics })?.etaSeconds).toBeNull();
    expect(jobProgress({ status: "queued", metrics: null })).toBeNull();
    expect(jobProgress({ status: "running", metrics: { step: "3", total_steps: 12 } })).toBeNull();
  });
});

describe("conversation", () => {
  const answer = (text: string, error: string | null = null) => ({ ...EMPTY_ANSWER, text, error });
  const turns: Turn[] = [
    { user: "Hi", answers: [answer("Hello"), answer("Hey")] },
    { user: "Fail?", answers: [answer("", "500 boom"), answer("No")] },
  ];
  it("sends each side its own replies, after the system prompt, and skips failed turns", () => {
    expect(messagesFor("Be brief.", turns, 0, "Next")).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" }, { role: "assistant", content: "Hello" },
      { role: "user", content: "Next" },
    ]);
    expect(messagesFor("  ", turns, 1).map((m) => m.content)).toEqual(["Hi", "Hey", "Fail?", "No"]);
  });
});

describe("copy as code", () => {
  const call = {
    baseUrl: "http://llm.example:8000",
    model: "support:prod",
    messages: [
      { role: "system" as const, content: "It's \"quoted\"" },
      { role: "user" as const, content: "line one\nline two $HOME `id`" },
    ],
    temperature: 0.2,
    maxTokens: 32,
  };
  it("quotes for the shell so that nothing in the text is expanded", () => {
    expect(shellQuote("it's")).toBe("'it'\\''s'");
    const command = curlCommand(call);
    expect(command).toContain("curl 'http://llm.example:8000/v1/chat/completions'");
    expect(command).toContain('-H "Authorization: Bearer $LORALOOM_API_KEY"');
    // The body is the JSON the API takes, recoverable from its single-quoted word.
    const quoted = command.slice(command.indexOf("-d '") + 4, -1).replaceAll("'\\''", "'");
    expect(JSON.parse(quoted)).toEqual({ model: "support:prod", messages: call.messages, temperature: 0.2, max_tokens: 32 });
  });
  it("writes Python literals, and a script that reads the key from the environment", () => {
    expect(pythonLiteral({ a: [true, false, null, 1.5, "x\"y"] })).toBe('{\n    "a": [\n        True,\n        False,\n        None,\n        1.5,\n        "x\\"y",\n    ],\n}');
    const script = pythonScript(call);
    expect(script).toContain('client = OpenAI(base_url="http://llm.example:8000/v1", api_key=os.environ["LORALOOM_API_KEY"])');
    expect(script).toContain('model="support:prod",');
    expect(script).toContain('"content": "line one\\nline two $HOME `id`"');
    expect(script).toContain("max_tokens=32,");
    expect(script).not.toContain("ll-");
  });
});

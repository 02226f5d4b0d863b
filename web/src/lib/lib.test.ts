import { describe, expect, it } from "vitest";
import { ApiError, errorFromBody, ok } from "../api/client";
import { components } from "../api/openapi.json";
import { adapterFiles, suggestedName } from "./dropped";
import { formatAgo, formatBytes } from "./format";
import { hyperparameterBody, hyperparameterFields } from "./hyperparameters";
import { rate } from "./rate";
import { placeOf, sharedSlots, totalsByAdapter } from "./residency";

describe("errorFromBody", () => {
  it("keeps the server's message, param and details", () => {
    const error = errorFromBody(400, JSON.stringify({ error: { message: "file: 2 invalid line(s)", param: "file", code: "invalid_training_file", details: { report: {} } } }));
    expect(error.status).toBe(400);
    expect(error.message).toBe("file: 2 invalid line(s)");
    expect(error.param).toBe("file");
    expect(error.details).toEqual({ report: {} });
  });
  it("shows a body that is not JSON as it is", () => {
    expect(errorFromBody(502, "Bad gateway\n").message).toBe("Bad gateway");
    expect(errorFromBody(500, "").message).toBe("HTTP 500");
  });
});

describe("ok", () => {
  it("passes a 2xx answer's body on", async () => {
    await expect(ok(Promise.resolve({ data: { id: "a" }, response: new Response(null, { status: 200 }) })))
      .resolves.toEqual({ id: "a" });
  });
  it("throws any other answer as an ApiError with the server's message", async () => {
    const error = { error: { message: "adapter 'x' does not exist", type: "invalid_request_error", param: null, code: "not_found" } };
    const refused = ok(Promise.resolve({ error, response: new Response(null, { status: 404 }) }));
    await expect(refused).rejects.toBeInstanceOf(ApiError);
    await expect(refused).rejects.toMatchObject({ status: 404, message: "adapter 'x' does not exist", code: "not_found" });
    // A body that was not JSON reaches ok() as text, and is shown as it is.
    await expect(ok(Promise.resolve({ error: "Bad gateway\n", response: new Response(null, { status: 502 }) })))
      .rejects.toMatchObject({ status: 502, message: "Bad gateway" });
  });
});

describe("format", () => {
  it("picks the unit of a byte count", () => {
    expect(formatBytes(7)).toBe("7 B");
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(3_000_000)).toMatch(/^3 MB$/);
    expect(formatBytes(1_500)).toMatch(/^1\.5 kB$/);
  });
  it("says how long ago", () => {
    const now = new Date("2024-05-01T12:00:00Z");
    expect(formatAgo("2024-05-01T11:57:00Z", now)).toMatch(/3 minutes ago/);
    expect(formatAgo(null, now)).toBe("never");
  });
});

describe("rate", () => {
  it("needs two samples and ignores a counter reset", () => {
    expect(rate([{ at: 0, total: 0 }])).toBeNull();
    expect(rate([{ at: 0, total: 10 }, { at: 2, total: 30 }])).toBe(10);
    expect(rate([{ at: 0, total: 30 }, { at: 2, total: 5 }])).toBeNull();
  });
});

describe("hyperparameters", () => {
  const openapi = { components: { schemas: { Hyperparameters: { properties: {
    n_epochs: { type: "integer", default: 3, minimum: 1, maximum: 100, description: "Passes." },
    target_modules: { type: "array", description: "Projections." },
  } } } } };
  it("reads fields and defaults from the OpenAPI document", () => {
    const fields = hyperparameterFields(openapi);
    expect(fields.map((f) => f.name)).toEqual(["n_epochs", "target_modules"]);
    expect(fields[0]).toMatchObject({ type: "integer", default: 3, minimum: 1, maximum: 100 });
  });
  it("sends only changed fields, and a non-number as typed for the server to name", () => {
    const fields = hyperparameterFields(openapi);
    expect(hyperparameterBody(fields, { n_epochs: "3" })).toEqual({});
    expect(hyperparameterBody(fields, { n_epochs: "5", target_modules: "q_proj, v_proj" })).toEqual({ n_epochs: 5, target_modules: ["q_proj", "v_proj"] });
    expect(hyperparameterBody(fields, { n_epochs: "five" })).toEqual({ n_epochs: "five" });
  });
  it("reads the server's own schema from the committed OpenAPI document", () => {
    const fields = hyperparameterFields({ components });
    const rank = fields.find((field) => field.name === "lora_r");
    expect(rank).toMatchObject({ type: "integer", minimum: 1 });
    expect(rank?.maximum).toBeGreaterThan(1);
    expect(fields.find((field) => field.name === "target_modules")).toMatchObject({ type: "array", default: [] });
  });
});

describe("dropped files", () => {
  const file = (name: string) => new File(["x"], name);
  it("keeps the two PEFT files of a directory, or one archive", () => {
    expect(adapterFiles([file("README.md"), file("adapter_config.json"), file("adapter_model.safetensors")]).map((f) => f.name))
      .toEqual(["adapter_config.json", "adapter_model.safetensors"]);
    expect(adapterFiles([file("adapter_config.json"), file("tokenizer.json"), file("chat_template.jinja")]).map((f) => f.name))
      .toEqual(["adapter_config.json", "chat_template.jinja"]);
    expect(adapterFiles([file("bot.tar.gz")]).map((f) => f.name)).toEqual(["bot.tar.gz"]);
  });
  it("suggests a valid adapter name", () => {
    expect(suggestedName("My Bot v2.tar.gz")).toBe("my-bot-v2");
    expect(suggestedName("adapter_config.json")).toBe("");
  });
});

describe("residency", () => {
  it("reports the best place of any version", () => {
    const entry = (location: "gpu" | "host") => ({ adapter: "a", version: 1, reference: "a@1", location, slot: null });
    expect(placeOf("a", [entry("host"), entry("gpu")], "cuda:0")).toBe("GPU slot");
    expect(placeOf("a", [entry("host"), entry("gpu")], "cpu")).toBe("CPU slot");
    expect(placeOf("a", [entry("host")], "cpu")).toBe("host cache");
    expect(placeOf("b", [entry("host")], "cuda")).toBe("storage only");
  });
  it("sums points per adapter", () => {
    const totals = totalsByAdapter([
      { adapter: "a", requests: 1, total_tokens: 10 }, { adapter: "a", requests: 2, total_tokens: 5 }, { adapter: null, requests: 1, total_tokens: 1 },
    ]);
    expect(totals.get("a")).toEqual({ requests: 3, tokens: 15 });
    expect(totals.get("base")).toEqual({ requests: 1, tokens: 1 });
  });
});

describe("shared slots", () => {
  it("lists the slots several byte-identical names share, and only those", () => {
    const at = (reference: string, slot: number | null) =>
      ({ adapter: reference.split("@")[0], version: 1, reference, location: slot === null ? "host" as const : "gpu" as const, slot });
    const shared = sharedSlots([at("a@1", 0), at("b@1", 0), at("c@1", 1), at("d@1", null), at("e@2", 0)]);
    expect([...shared]).toEqual([[0, ["a@1", "b@1", "e@2"]]]);
  });
});

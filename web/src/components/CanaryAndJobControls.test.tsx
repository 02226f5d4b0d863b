/// <reference types="node" />
// The split editor and a job's buttons in jsdom, against a small local HTTP server that records what
// the console sends and answers as the API does: Save puts the split as typed, a bad weight is held
// back before any request, and Pause, Resume and Cancel appear by the job's status and call their routes.
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { fireEvent, render, screen, waitFor } from "@testing-library/react";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { MemoryRouter } from "react-router-dom";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { Api } from "../api/client";
import type { AliasState, Job, Me } from "../api/types";
import { SessionContext } from "../session";
import { JobActions, useJobAction } from "./JobActions";
import { SplitEditor } from "./SplitEditor";

let server: Server;
let url = "";
const received: { method: string; path: string; body: unknown }[] = [];

beforeAll(async () => {
  server = createServer((request: IncomingMessage, response: ServerResponse) => {
    // The page (origin http://localhost:3000) calls another origin here: answer CORS like a proxy would.
    response.setHeader("Access-Control-Allow-Origin", "*");
    response.setHeader("Access-Control-Allow-Headers", "Authorization, Content-Type");
    response.setHeader("Access-Control-Allow-Methods", "GET, POST, PUT");
    if (request.method === "OPTIONS") return response.end();
    let text = "";
    request.on("data", (chunk) => (text += chunk));
    request.on("end", () => {
      received.push({ method: request.method ?? "", path: request.url ?? "", body: text ? JSON.parse(text) : null });
      response.setHeader("Content-Type", "application/json");
      const paused = (request.url ?? "").endsWith("/pause");
      response.end(JSON.stringify(paused ? { ...job("running"), status: "paused" } : {}));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
beforeEach(() => {
  received.length = 0;
});

const me: Me = { object: "api_key.self", key_id: "k", key_name: "ci", key_prefix: "ll-ci", role: "developer", tenant_id: "t", tenant: "acme",
  operator: false, limits: { tenant: { share_weight: 1 }, key: {}, remaining: { tenant: {}, key: {} } } };

function withSession(children: React.ReactNode) {
  return render(
    <QueryClientProvider client={new QueryClient()}>
      <SessionContext.Provider value={{ api: new Api("ll-test", url), me, signOut: () => {} }}>
        <MemoryRouter>{children}</MemoryRouter>
      </SessionContext.Provider>
    </QueryClientProvider>,
  );
}

describe("the split editor", () => {
  const prod: AliasState = { object: "adapter.alias", adapter: "bot", alias: "prod", version: 3, split: null,
    updated_at: "2026-01-01T00:00:00Z", updated_by_key_id: null };

  it("puts the split as typed", async () => {
    withSession(<SplitEditor adapter="bot" current={prod} versions={[1, 2, 3, 4]} />);
    expect(screen.getByTestId("share-1").textContent).toBe("90%");
    fireEvent.change(screen.getByLabelText("Weight of row 2"), { target: { value: "30" } });
    expect(screen.getByTestId("share-2").textContent).toBe("25%");
    fireEvent.click(screen.getByRole("button", { name: "Add version" }));
    fireEvent.change(screen.getByLabelText("Weight of row 3"), { target: { value: "60" } });
    fireEvent.click(screen.getByRole("button", { name: "Save split" }));
    await waitFor(() => expect(received).toHaveLength(1));
    expect(received[0]).toEqual({ method: "PUT", path: "/v1/adapters/bot/aliases/prod",
      body: { split: [{ version: 3, weight: 90 }, { version: 4, weight: 30 }, { version: 2, weight: 60 }] } });
  });

  it("holds a bad weight back, naming the row, before any request", () => {
    withSession(<SplitEditor adapter="bot" current={prod} versions={[3, 4]} />);
    fireEvent.change(screen.getByLabelText("Weight of row 1"), { target: { value: "1.5" } });
    expect(screen.getByRole("note").textContent).toMatch(/^Row 1: the weight/);
    expect((screen.getByRole("button", { name: "Save split" }) as HTMLButtonElement).disabled).toBe(true);
    expect(screen.queryByRole("button", { name: "Add version" })).toHaveProperty("disabled", true); // both versions are in it
    expect(received).toHaveLength(0);
  });
});

function job(status: string): Job {
  return { object: "fine_tuning.job", id: "ftjob-1", created_at: 0, finished_at: null, model: "base", fine_tuned_model: null,
    organization_id: "t", status, hyperparameters: {}, training_file: "file-1", validation_file: null, result_files: [],
    trained_tokens: null, error: null, seed: 1, suffix: "bot", attempts: 1, max_attempts: 3, metrics: null,
    method: { type: "supervised" }, metadata: null, early_stopping: null, from_checkpoint: null, promote: null };
}

function Actions({ status }: { status: string }) {
  const act = useJobAction("ftjob-1");
  return <JobActions job={job(status)} act={act} />;
}

describe("a job's buttons", () => {
  const names = () => screen.getAllByRole("button").map((button) => button.textContent);

  it("are those the job's status allows", () => {
    const { unmount } = withSession(<Actions status="running" />);
    expect(names()).toEqual(["Pause", "Cancel job"]);
    unmount();
    withSession(<Actions status="paused" />);
    expect(names()).toEqual(["Resume", "Cancel job"]);
  });

  it("call the job's route", async () => {
    withSession(<Actions status="running" />);
    fireEvent.click(screen.getByRole("button", { name: "Pause" }));
    await waitFor(() => expect(received.map((r) => `${r.method} ${r.path}`)).toEqual(["POST /v1/fine_tuning/jobs/ftjob-1/pause"]));
  });
});

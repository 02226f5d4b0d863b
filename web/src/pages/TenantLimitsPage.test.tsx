/// <reference types="node" />
// The tenant limits page in jsdom against a small local server answering as the API does: the stored
// limits fill the form, saving sends every limit (an emptied field as null, unlimited), and the
// server's refusal of a bad value is shown with its own message.
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { fireEvent, render, screen } from "@testing-library/react";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { MemoryRouter, Route, Routes } from "react-router-dom";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { Api } from "../api/client";
import type { Me, TenantLimitsBody } from "../api/types";
import { SessionContext } from "../session";
import { TenantLimitsPage } from "./TenantLimitsPage";

const REFUSAL = "requests_per_minute: Input should be greater than or equal to 1";
let server: Server;
let url = "";
let stored: TenantLimitsBody;
const puts: { path: string; body: TenantLimitsBody }[] = [];

beforeAll(async () => {
  server = createServer((request: IncomingMessage, response: ServerResponse) => {
    response.setHeader("Access-Control-Allow-Origin", "*");
    response.setHeader("Access-Control-Allow-Headers", "Authorization, Content-Type");
    response.setHeader("Access-Control-Allow-Methods", "GET, PUT");
    if (request.method === "OPTIONS") return response.end();
    let text = "";
    request.on("data", (chunk) => (text += chunk));
    request.on("end", () => {
      response.setHeader("Content-Type", "application/json");
      if (request.method === "PUT") {
        const body = JSON.parse(text) as TenantLimitsBody;
        puts.push({ path: request.url ?? "", body });
        if (body.requests_per_minute != null && body.requests_per_minute < 1) {
          response.statusCode = 400;
          return response.end(JSON.stringify({ error: { message: REFUSAL, type: "invalid_request_error",
            param: "requests_per_minute", code: null } }));
        }
        stored = body;
      }
      response.end(JSON.stringify({ object: "tenant.limits", tenant: "acme", ...stored }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));
beforeEach(() => {
  stored = { requests_per_minute: 60, tokens_per_minute: 90000, max_concurrent_requests: null, max_training_jobs: 2,
    monthly_tokens: null, share_weight: 1.5 };
  puts.length = 0;
});

function renderPage() {
  const me: Me = { object: "api_key.self", key_id: "k", key_name: "ops", key_prefix: "ll-op", role: "admin", tenant_id: "t", tenant: "default",
    operator: true, limits: { tenant: { share_weight: 1 }, key: {}, remaining: { tenant: {}, key: {} } } };
  render(
    <QueryClientProvider client={new QueryClient()}>
      <SessionContext.Provider value={{ api: new Api("ll-test", url), me, signOut: () => {} }}>
        <MemoryRouter initialEntries={["/tenants/acme/limits"]}>
          <Routes>
            <Route path="/tenants/:name/limits" element={<TenantLimitsPage />} />
          </Routes>
        </MemoryRouter>
      </SessionContext.Provider>
    </QueryClientProvider>,
  );
}

describe("the tenant limits page", () => {
  it("shows the stored limits and saves every limit, an emptied one as unlimited", async () => {
    renderPage();
    const rpm = (await screen.findByLabelText("Requests per minute")) as HTMLInputElement;
    expect(rpm.value).toBe("60");
    expect((screen.getByLabelText("Concurrent requests") as HTMLInputElement).value).toBe("");
    expect((screen.getByLabelText("Fair-share weight") as HTMLInputElement).value).toBe("1.5");
    fireEvent.change(rpm, { target: { value: "120" } });
    fireEvent.change(screen.getByLabelText("Tokens per minute"), { target: { value: "" } });
    fireEvent.change(screen.getByLabelText("Tokens per month"), { target: { value: "1000000" } });
    fireEvent.click(screen.getByRole("button", { name: "Save limits" }));
    expect(await screen.findByText("Saved")).toBeTruthy();
    expect(puts).toEqual([{ path: "/v1/tenants/acme/limits", body: { requests_per_minute: 120, tokens_per_minute: null,
      max_concurrent_requests: null, max_training_jobs: 2, monthly_tokens: 1000000, share_weight: 1.5 } }]);
  });

  it("shows the server's refusal of a bad value", async () => {
    renderPage();
    fireEvent.change(await screen.findByLabelText("Requests per minute"), { target: { value: "-5" } });
    fireEvent.click(screen.getByRole("button", { name: "Save limits" }));
    const alert = await screen.findByRole("alert");
    expect(alert.textContent).toContain("400");
    expect(alert.textContent).toContain(REFUSAL);
    expect(puts[0].body.requests_per_minute).toBe(-5);
  });
});

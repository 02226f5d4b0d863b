/// <reference types="node" />
// The upload page in jsdom: files dropped on the drop zone are listed, and a refusal from the
// server (a real HTTP exchange with a small local server answering as the API does) is shown
// next to the files with the server's own message.
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { fireEvent, render, screen, within } from "@testing-library/react";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { MemoryRouter } from "react-router-dom";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Api } from "../api/client";
import type { Me } from "../api/types";
import { SessionContext } from "../session";
import { UploadPage } from "./UploadPage";

const REFUSAL = "module layers.0.self_attn.q_proj: lora_A is [4, 100], the base needs [4, 576]";
let server: Server;
let url = "";
const received: string[] = []; // the paths of the uploads the server got

beforeAll(async () => {
  server = createServer((request: IncomingMessage, response: ServerResponse) => {
    // The page (origin http://localhost:3000) calls another origin here: answer CORS like a proxy would.
    response.setHeader("Access-Control-Allow-Origin", "*");
    response.setHeader("Access-Control-Allow-Headers", "Authorization, Content-Type");
    if (request.method === "OPTIONS") return response.end();
    received.push(request.url ?? "");
    request.resume();
    request.on("end", () => {
      response.statusCode = 400;
      response.setHeader("Content-Type", "application/json");
      response.end(JSON.stringify({ error: { message: REFUSAL, type: "invalid_request_error", param: "files", code: null } }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

function renderPage() {
  const me: Me = { object: "api_key.self", key_id: "k", key_name: "ci", key_prefix: "ll-ci", role: "developer", tenant_id: "t", tenant: "acme",
    operator: false, limits: { tenant: { share_weight: 1 }, key: {}, remaining: { tenant: {}, key: {} } } };
  render(
    <QueryClientProvider client={new QueryClient()}>
      <SessionContext.Provider value={{ api: new Api("ll-test", url), me, signOut: () => {} }}>
        <MemoryRouter>
          <UploadPage />
        </MemoryRouter>
      </SessionContext.Provider>
    </QueryClientProvider>,
  );
}

const peftFiles = () => [
  new File(['{"r": 4}'], "adapter_config.json"),
  new File([new Uint8Array(2048)], "adapter_model.safetensors"),
  new File(["# notes"], "README.md"),
];

describe("the upload page's drop zone", () => {
  it("lists the two PEFT files of a drop and leaves out the rest", async () => {
    renderPage();
    const zone = screen.getByRole("group", { name: "Drop zone" });
    fireEvent.dragEnter(zone, { dataTransfer: { files: [], items: [] } });
    expect(zone.className).toContain("over");
    fireEvent.drop(zone, { dataTransfer: { files: peftFiles(), items: [] } });
    const list = await screen.findByRole("list", { name: "Files to upload" });
    expect(within(list).getAllByRole("listitem").map((item) => item.querySelector("code")?.textContent)).toEqual([
      "adapter_config.json",
      "adapter_model.safetensors",
    ]);
    expect(zone.className).not.toContain("over");
    // Loose files do not name the adapter: the name is left for the user.
    expect((screen.getByLabelText("Adapter name") as HTMLInputElement).value).toBe("");
  });

  it("names the adapter after a dropped archive", async () => {
    renderPage();
    const archive = new File([new Uint8Array(64)], "Support Bot.tar.gz");
    fireEvent.drop(screen.getByRole("group", { name: "Drop zone" }), { dataTransfer: { files: [archive], items: [] } });
    await screen.findByRole("list", { name: "Files to upload" });
    expect((screen.getByLabelText("Adapter name") as HTMLInputElement).value).toBe("support-bot");
  });

  it("shows the server's refusal next to the files", async () => {
    renderPage();
    fireEvent.drop(screen.getByRole("group", { name: "Drop zone" }), { dataTransfer: { files: peftFiles(), items: [] } });
    await screen.findByRole("list", { name: "Files to upload" });
    fireEvent.change(screen.getByLabelText("Adapter name"), { target: { value: "broken-bot" } });
    fireEvent.click(screen.getByRole("button", { name: "Upload" }));
    const list = screen.getByRole("list", { name: "Files to upload" });
    const refusal = await within(list).findByRole("alert", {}, { timeout: 10_000 });
    expect(refusal.textContent).toBe(`Refused: 400 ${REFUSAL}`);
    expect(received).toContain("/v1/adapters/broken-bot/versions");
    expect(screen.queryByRole("status")).toBeNull(); // nothing claims it was registered
  });
});

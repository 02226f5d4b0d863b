import { render, screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import { ApiError, errorFromBody } from "../api/client";
import { ErrorBox } from "./States";

describe("ErrorBox", () => {
  it("shows a 4xx's status and the server's own message", () => {
    const body = JSON.stringify({
      error: { message: "hyperparameters.lora_r: must be at most 64", type: "invalid_request_error", param: "lora_r", code: null },
    });
    render(<ErrorBox error={errorFromBody(400, body)} title="Refused" />);
    const alert = screen.getByRole("alert");
    expect(alert.textContent).toBe("Refused: 400 hyperparameters.lora_r: must be at most 64");
  });

  it("shows a FastAPI detail or a plain-text body as it is", () => {
    render(<ErrorBox error={errorFromBody(404, JSON.stringify({ detail: "Not Found" }))} />);
    expect(screen.getByRole("alert").textContent).toBe("404 Not Found");
  });

  it("shows an unreachable server without a made-up status", () => {
    render(<ErrorBox error={new ApiError(0, "The server could not be reached")} />);
    expect(screen.getByRole("alert").textContent).toBe("The server could not be reached");
  });

  it("renders nothing when there is no error", () => {
    const { container } = render(<ErrorBox error={null} />);
    expect(container.innerHTML).toBe("");
  });
});

import { fireEvent, render, screen } from "@testing-library/react";
import { describe, expect, it, vi } from "vitest";
import { ConfirmButton } from "./Confirm";

function open(onConfirm = vi.fn()) {
  render(<ConfirmButton label="Delete" danger question="Delete bot and all its versions?" confirmLabel="Delete for good" onConfirm={onConfirm} />);
  fireEvent.click(screen.getByRole("button", { name: "Delete" }));
  return { onConfirm, dialog: screen.getByRole("alertdialog", { name: "Delete bot and all its versions?" }) };
}

describe("ConfirmButton", () => {
  it("asks first and acts only on the confirming button", () => {
    const { onConfirm, dialog } = open();
    expect(dialog.getAttribute("aria-modal")).toBe("true");
    expect(onConfirm).not.toHaveBeenCalled();
    fireEvent.click(screen.getByRole("button", { name: "Delete for good" }));
    expect(onConfirm).toHaveBeenCalledTimes(1);
    expect(screen.queryByRole("alertdialog")).toBeNull();
  });

  it("starts on the confirming button and keeps Tab inside the dialog", () => {
    const { dialog } = open();
    const confirm = screen.getByRole("button", { name: "Delete for good" });
    const dismiss = screen.getByRole("button", { name: "Cancel" });
    expect(document.activeElement).toBe(confirm);
    fireEvent.keyDown(dialog, { key: "Tab" });
    expect(document.activeElement).toBe(dismiss);
    fireEvent.keyDown(dialog, { key: "Tab" }); // past the last button: back to the first
    expect(document.activeElement).toBe(confirm);
    fireEvent.keyDown(dialog, { key: "Tab", shiftKey: true }); // and backwards past the first
    expect(document.activeElement).toBe(dismiss);
  });

  it("closes on Escape without acting and gives focus back to its button", () => {
    const { onConfirm, dialog } = open();
    fireEvent.keyDown(dialog, { key: "Escape" });
    expect(screen.queryByRole("alertdialog")).toBeNull();
    expect(onConfirm).not.toHaveBeenCalled();
    expect(document.activeElement).toBe(screen.getByRole("button", { name: "Delete" }));
  });

  it("closes on a click on the backdrop, but not on one inside the dialog", () => {
    const { onConfirm, dialog } = open();
    fireEvent.click(dialog);
    expect(screen.getByRole("alertdialog")).toBeTruthy();
    fireEvent.click(dialog.parentElement!);
    expect(screen.queryByRole("alertdialog")).toBeNull();
    expect(onConfirm).not.toHaveBeenCalled();
  });
});

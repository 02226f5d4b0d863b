import { fireEvent, render, screen, within } from "@testing-library/react";
import { createColumnHelper } from "@tanstack/react-table";
import { describe, expect, it } from "vitest";
import { DataTable } from "./DataTable";

interface Row {
  name: string;
  rank: number;
}
const column = createColumnHelper<Row>();
const columns = [column.accessor("name", { header: "Name" }), column.accessor("rank", { header: "Rank" })];
// 25 adapters: bot-00 (rank 1) ... bot-24 (rank 25), listed out of order.
const rows: Row[] = Array.from({ length: 25 }, (_, n) => ({ name: `bot-${String(n).padStart(2, "0")}`, rank: n + 1 })).reverse();

const names = () =>
  within(screen.getByRole("table", { name: "Adapters" }))
    .getAllByRole("row")
    .slice(1)
    .map((row) => within(row).getAllByRole("cell")[0].textContent);

describe("DataTable", () => {
  it("sorts by the initial column and pages through the rows", () => {
    render(<DataTable label="Adapters" data={rows} columns={columns} pageSize={10} initialSort={[{ id: "name", desc: false }]} />);
    expect(names()).toEqual(Array.from({ length: 10 }, (_, n) => `bot-0${n}`));
    expect(screen.getByText("Page 1 of 3")).toBeTruthy();
    expect(screen.getByRole("button", { name: "Previous" }).hasAttribute("disabled")).toBe(true);
    fireEvent.click(screen.getByRole("button", { name: "Next" }));
    fireEvent.click(screen.getByRole("button", { name: "Next" }));
    expect(screen.getByText("Page 3 of 3")).toBeTruthy();
    expect(names()).toEqual(["bot-20", "bot-21", "bot-22", "bot-23", "bot-24"]);
    expect(screen.getByRole("button", { name: "Next" }).hasAttribute("disabled")).toBe(true);
  });

  it("sorts numbers by value when a header is clicked, and says so in aria-sort", () => {
    render(<DataTable label="Adapters" data={rows} columns={columns} pageSize={30} />);
    const header = () => screen.getByRole("columnheader", { name: /Rank/ });
    fireEvent.click(within(header()).getByRole("button"));
    expect(header().getAttribute("aria-sort")).toBe("descending"); // numbers: the largest first
    expect(names()[0]).toBe("bot-24");
    fireEvent.click(within(header()).getByRole("button"));
    expect(header().getAttribute("aria-sort")).toBe("ascending");
    // 1, 2, ..., 10 by value, not "1", "10", "11" as text.
    expect(names().slice(0, 3)).toEqual(["bot-00", "bot-01", "bot-02"]);
  });

  it("filters by the search text and says when nothing matches", () => {
    const { rerender } = render(<DataTable label="Adapters" data={rows} columns={columns} search="bot-1" />);
    expect(names()).toHaveLength(10);
    rerender(<DataTable label="Adapters" data={rows} columns={columns} search="nothing-like-it" />);
    expect(names()).toHaveLength(0);
    expect(screen.getByText("No rows match “nothing-like-it”.")).toBeTruthy();
  });
});

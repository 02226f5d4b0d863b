// An alias's split between versions: what the editor refuses before Save, the shares as percentages,
// where the editor starts, and a canary's figures per version from the usage report.
import { describe, expect, it } from "vitest";
import type { UsageBucket } from "../api/types";
import { canaryFigures } from "./canaryFigures";
import { canaryOf, formatSplit, percentages, sharesOf, splitProblem, splitStartedAt, startingRows, versionBeforeSplit } from "./split";

describe("split", () => {
  it("refuses fewer than two versions, a version twice and weights that are not whole numbers of 1 or more", () => {
    expect(splitProblem([{ version: 1, weight: "100" }])).toMatch(/2 versions or more/);
    expect(splitProblem([{ version: 1, weight: "90" }, { version: 1, weight: "10" }])).toMatch(/^Row 2: v1 is already/);
    expect(splitProblem([{ version: 1, weight: "90" }, { version: 2, weight: "0" }])).toMatch(/^Row 2: the weight/);
    expect(splitProblem([{ version: 1, weight: "2.5" }, { version: 2, weight: "1" }])).toMatch(/^Row 1: the weight/);
    expect(splitProblem([{ version: 1, weight: "" }, { version: 2, weight: "1" }])).toMatch(/^Row 1: the weight/);
    expect(splitProblem([{ version: 1, weight: "90" }, { version: 2, weight: "10" }])).toBeNull();
  });
  it("reads weights as shares of their total", () => {
    const shares = sharesOf([{ version: 3, weight: "3" }, { version: 4, weight: "1" }]);
    expect(percentages(shares)).toEqual([{ version: 3, percent: 75 }, { version: 4, percent: 25 }]);
    expect(formatSplit([{ version: 4, weight: 1 }, { version: 3, weight: 2 }])).toBe("v3 66.7% · v4 33.3%");
    expect(canaryOf(shares)).toBe(4);
  });
  it("starts from the alias's split, or its version at 90 and the newest other at 10", () => {
    expect(startingRows({ version: 3, split: [{ version: 3, weight: 7 }, { version: 5, weight: 3 }] }, [3, 4, 5]))
      .toEqual([{ version: 3, weight: "7" }, { version: 5, weight: "3" }]);
    expect(startingRows({ version: 2, split: null }, [1, 2, 3])).toEqual([{ version: 2, weight: "90" }, { version: 3, weight: "10" }]);
    expect(startingRows({ version: 3, split: null }, [1, 2, 3])).toEqual([{ version: 3, weight: "90" }, { version: 2, weight: "10" }]);
  });
});

describe("canaryFigures", () => {
  const bucket = (adapter: string, version: number | null, requests: number, errors: number, alias = "prod"): UsageBucket => ({
    adapter, version, alias, requests, errors, aborted: 0, prompt_tokens: 10 * requests, completion_tokens: 5 * requests,
    total_tokens: 15 * requests, cached_tokens: 0, mean_time_to_first_token_ms: 100, mean_duration_ms: 400,
  });
  it("gives each version of the split its own figures, zeros for one without requests yet", () => {
    const figures = canaryFigures([bucket("bot", 2, 10, 1), bucket("other", 3, 50, 0), bucket("bot", 1, 90, 0),
      bucket("bot", 1, 7, 0, "staging"), bucket("bot", 3, 7, 0, "staging")], "bot", "prod", [3, 1, 2]);
    expect(figures.map((f) => [f.version, f.requests, f.errors, f.totalTokens])).toEqual([[1, 90, 0, 1350], [2, 10, 1, 150], [3, 0, 0, 0]]);
    expect(figures[1].errorRate).toBeCloseTo(0.1);
    expect(figures[2]).toMatchObject({ errorRate: null, meanTtftMs: null, meanDurationMs: null });
  });
});

describe("an alias's split in its history", () => {
  const change = (action: string, to_version: number | null, changed_at: string) => ({ action, to_version, changed_at });
  const history = [change("set", 1, "t1"), change("set", 2, "t2"), change("split", 2, "t3"), change("split", 3, "t4")];
  it("rolls back to the version named alone before the split, whatever weight changes came since", () => {
    expect(versionBeforeSplit(history)).toBe(2);
    expect(versionBeforeSplit([change("split", 2, "t1")])).toBeNull(); // created split
    expect(versionBeforeSplit([change("set", 1, "t1"), change("delete", null, "t2"), change("split", 2, "t3")])).toBeNull();
    expect(versionBeforeSplit(history.slice(0, 2))).toBeNull(); // not split
  });
  it("counts a canary's figures from the split's first change", () => {
    expect(splitStartedAt(history)).toBe("t3");
    expect(splitStartedAt([...history, change("promote", 3, "t5")])).toBeNull();
  });
});

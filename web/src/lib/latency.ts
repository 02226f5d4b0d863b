// Latency and error figures for display: milliseconds that stay readable from a few ms to minutes,
// and error rates as percentages that never round a real failure down to "0%".

const oneDecimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
const twoDecimals = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2, minimumFractionDigits: 2 });
const wholeNumber = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });

/** A duration given in milliseconds: "—" when unknown (no request produced a token), "840 ms", "1.25 s", "2 min 5 s". */
export function formatMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 10) return `${oneDecimal.format(ms)} ms`;
  if (ms < 1000) return `${wholeNumber.format(ms)} ms`;
  if (ms < 60_000) return `${twoDecimals.format(ms / 1000)} s`;
  const seconds = Math.round(ms / 1000);
  return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

/** errors / requests as a percentage; any error at all shows as more than 0% (a rounded "0%" would hide it). */
export function formatErrorRate(errors: number, requests: number): string {
  if (requests <= 0) return "—";
  if (errors === 0) return "0%";
  const percent = (errors / requests) * 100;
  if (percent < 0.1) return "<0.1%";
  return `${oneDecimal.format(percent)}%`;
}

/** Seconds left, as "45 s", "3 min 20 s" or "1 h 05 min": an ETA does not need more precision. */
export function formatSeconds(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds) || seconds < 0) return "—";
  const whole = Math.round(seconds);
  if (whole < 60) return `${whole} s`;
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  return `${Math.floor(whole / 3600)} h ${String(Math.floor((whole % 3600) / 60)).padStart(2, "0")} min`;
}

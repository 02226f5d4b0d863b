// Display formatting through the platform's Intl, so dates and numbers follow the user's locale.

const dateTime = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
const relative = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });
const integer = new Intl.NumberFormat();
const bytesUnits = ["byte", "kilobyte", "megabyte", "gigabyte"] as const;

/** An ISO string or Unix seconds, as a local date and time; "—" when absent. */
export function formatDate(value: string | number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return dateTime.format(toDate(value));
}

export function toDate(value: string | number): Date {
  return typeof value === "number" ? new Date(value * 1000) : new Date(value);
}

/** "3 minutes ago" for a time up to a month back, else the date. */
export function formatAgo(value: string | number | null | undefined, now: Date = new Date()): string {
  if (value === null || value === undefined) return "never";
  const seconds = (toDate(value).getTime() - now.getTime()) / 1000;
  const steps: [Intl.RelativeTimeFormatUnit, number][] = [["second", 60], ["minute", 60], ["hour", 24], ["day", 30]];
  let amount = seconds;
  for (const [unit, size] of steps) {
    if (Math.abs(amount) < size) return relative.format(Math.round(amount), unit);
    amount /= size;
  }
  return formatDate(value);
}

export function formatNumber(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : integer.format(value);
}

/** Bytes with the largest unit that keeps the number at or above 1, via Intl's unit formatting.
 * Decimal units (1 kB = 1000 B), as Intl's kilobyte and megabyte names mean; plain bytes as "B". */
export function formatBytes(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  let amount = value;
  let unit = 0;
  while (amount >= 1000 && unit < bytesUnits.length - 1) {
    amount /= 1000;
    unit += 1;
  }
  if (unit === 0) return `${integer.format(amount)} B`;
  return new Intl.NumberFormat(undefined, {
    style: "unit", unit: bytesUnits[unit], unitDisplay: "short", maximumFractionDigits: 1,
  }).format(amount);
}

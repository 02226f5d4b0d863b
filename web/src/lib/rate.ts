// Rates from cumulative counters sampled over time (what the server reports are totals).

export interface Sample {
  at: number; // seconds
  total: number;
}

/** Per-second rate between the last two samples; null until there are two (or no time passed). */
export function rate(samples: Sample[]): number | null {
  if (samples.length < 2) return null;
  const [before, after] = samples.slice(-2);
  const seconds = after.at - before.at;
  if (seconds <= 0) return null;
  // A restarted server starts its counters again at zero: that interval has no rate.
  return after.total >= before.total ? (after.total - before.total) / seconds : null;
}

/** The samples with a new one added, keeping at most `keep`. */
export function addSample(samples: Sample[], sample: Sample, keep = 120): Sample[] {
  return [...samples, sample].slice(-keep);
}

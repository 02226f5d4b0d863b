// A time or step series chart drawn by uPlot (small, canvas-based). The chart is made once per
// set of series and then only given new data, so a live chart does not flicker.
import { useEffect, useRef } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export interface Series {
  label: string;
  color: string;
  values: (number | null)[];
  // Mark every value: for a sparse series (eval loss every few steps) whose lone points a line would not show.
  points?: boolean;
}

// Tick spacings uPlot may choose from. Steps are whole numbers and a time axis never goes below a
// second: by default uPlot labels a few seconds of live data in milliseconds and steps as 1.5, 2.5.
const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000];
const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];

interface Props {
  x: number[];
  series: Series[];
  time?: boolean; // x is Unix seconds
  xLabel: string;
  height?: number;
  label: string;
  xRange?: [number, number]; // fixed x extent (e.g. the period asked for), not just the points' span
}

export function LineChart({ x, series, time = false, xLabel, height = 240, label, xRange }: Props) {
  const holder = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const shape = series.map((s) => s.label).join("|") + String(time);

  useEffect(() => {
    const element = holder.current!;
    const options: uPlot.Options = {
      width: Math.max(element.clientWidth, 300),
      height,
      scales: { x: xRange ? { time, range: () => xRange } : { time } },
      axes: [{ label: xLabel, incrs: time ? TIME_INCRS : STEP_INCRS }, {}],
      series: [{ label: xLabel }, ...series.map((s) => ({
        label: s.label, stroke: s.color, width: 2, spanGaps: true,
        ...(s.points ? { points: { show: true, size: 7, fill: s.color } } : {}),
      }))],
    };
    plot.current = new uPlot(options, [[], ...series.map(() => [])], element);
    const resize = new ResizeObserver(() => plot.current?.setSize({ width: Math.max(element.clientWidth, 300), height }));
    resize.observe(element);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
    // Rebuilt only when the set of series changes; data updates go through setData below.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [shape, height, xLabel, xRange?.[0], xRange?.[1]]);

  useEffect(() => {
    plot.current?.setData([x, ...series.map((s) => s.values)] as uPlot.AlignedData);
  }, [x, series, shape]);

  return <div className="chart" ref={holder} role="img" aria-label={label} data-points={x.length} />;
}

/**
 * Charts: an SVG sparkline for table rows, and a uPlot time series for the detail page (uPlot
 * is loaded when the first chart is drawn: the list pages do not fetch it).
 */
import { useEffect, useRef } from "preact/hooks";
import type uPlot from "uplot";

/**
 * A sparkline of `values` scaled to `max` (or their own maximum), `w` x `h` pixels. Fewer than
 * two points draw a flat line.
 */
export function Sparkline({ values, max, w = 80, h = 18, label }: { values: number[]; max?: number; w?: number; h?: number; label: string }) {
  const top = Math.max(max ?? 0, ...values, 1e-9);
  const pts = values.length > 1 ? values : [values[0] ?? 0, values[0] ?? 0];
  const step = w / (pts.length - 1);
  const d = pts.map((v, i) => `${(i * step).toFixed(1)},${(h - 1 - (Math.min(v, top) / top) * (h - 2)).toFixed(1)}`).join(" ");
  return (
    <svg class="spark" width={w} height={h} viewBox={`0 0 ${w} ${h}`} role="img" aria-label={label}>
      <polyline points={d} fill="none" stroke="currentColor" stroke-width="1.5" />
    </svg>
  );
}

/** One series of a TimeChart. */
export interface Series {
  label: string;
  values: (number | null)[];
  stroke: string;
}

/**
 * A line chart over time (`times` in unix seconds) drawn by uPlot; `format` labels the y axis.
 * Re-drawn with new data without re-creating the chart.
 */
export function TimeChart({ title, times, series, format, height = 160 }: { title: string; times: number[]; series: Series[]; format: (v: number) => string; height?: number }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const data = [times, ...series.map((s) => s.values)] as uPlot.AlignedData;
  const latest = useRef(data);
  latest.current = data;
  useEffect(() => {
    const el = box.current!;
    let gone = false;
    let ro: ResizeObserver | undefined;
    void import("uplot").then(({ default: UPlot }) => {
      if (gone) return;
      const u = new UPlot(
        {
          title,
          width: Math.max(200, el.clientWidth),
          height,
          series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.stroke, width: 1.5, value: (_: uPlot, v: number | null) => (v === null ? "-" : format(v)) }))],
          axes: [{}, { values: (_: uPlot, vs: number[]) => vs.map(format), size: 70 }],
          scales: { y: { range: (_: uPlot, lo: number, hi: number) => [Math.min(0, lo), Math.max(hi, 1e-9) * 1.1] } },
        },
        latest.current,
        el,
      );
      plot.current = u;
      ro = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height }));
      ro.observe(el);
    });
    return () => {
      gone = true;
      ro?.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
  }, [title, series.length]);
  useEffect(() => plot.current?.setData(data), [data]);
  return <div class="chart" ref={box} />;
}

// A small line chart drawn as SVG markup: time on x (the last `windowMs`), values on y from
// 0 to the largest seen (or `max`), one polyline per series, a legend. Names are escaped;
// nothing is fetched. A gap (null) breaks a line.
import { esc } from "./format.js";

const W = 360, H = 140, PAD = { left: 44, right: 8, top: 10, bottom: 20 };
export const PALETTE = 6;

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= value);
}

function label(value, unit) {
  const text = value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
  return `${text.includes(".") ? text.replace(/\.?0+$/, "") : text}${unit}`;
}

export function lineChart({ title, unit = "", series, now, windowMs, max = null, empty = "no data yet" }) {
  const values = series.flatMap((s) => s.points.map(([, v]) => v)).filter((v) => v != null && Number.isFinite(v));
  const top = max ?? niceMax(Math.max(0, ...values));
  const x = (t) => PAD.left + ((t - (now - windowMs)) / windowMs) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (Math.min(v, top) / top) * (H - PAD.top - PAD.bottom);
  const lines = series.map((s, k) => {
    const runs = [[]];
    for (const [t, v] of s.points) {
      if (t < now - windowMs) continue;
      if (v == null || !Number.isFinite(v)) { if (runs.at(-1).length) runs.push([]); continue; }
      runs.at(-1).push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    }
    return runs.filter((r) => r.length).map((r) => r.length === 1
      ? `<circle class="series s${k % PALETTE}" cx="${r[0].split(",")[0]}" cy="${r[0].split(",")[1]}" r="2"></circle>`
      : `<polyline class="series s${k % PALETTE}" points="${r.join(" ")}"></polyline>`).join("");
  }).join("");
  const latest = series.map((s, k) => {
    const last = s.points.findLast(([, v]) => v != null && Number.isFinite(v));
    return `<li class="s${k % PALETTE}"><span class="swatch"></span>${esc(s.name)}${last ? `: ${esc(label(last[1], unit))}` : ""}</li>`;
  }).join("");
  const minutes = Math.round(windowMs / 60000);
  return `<figure class="chart" data-chart="${esc(title)}">
    <figcaption>${esc(title)}</figcaption>
    <svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)} over the last ${minutes} minutes">
      <line class="axis" x1="${PAD.left}" y1="${H - PAD.bottom}" x2="${W - PAD.right}" y2="${H - PAD.bottom}"></line>
      <line class="grid-line" x1="${PAD.left}" y1="${PAD.top}" x2="${W - PAD.right}" y2="${PAD.top}"></line>
      <text class="tick" x="${PAD.left - 4}" y="${PAD.top + 4}" text-anchor="end">${esc(label(top, unit))}</text>
      <text class="tick" x="${PAD.left - 4}" y="${H - PAD.bottom}" text-anchor="end">0</text>
      <text class="tick" x="${PAD.left}" y="${H - 4}">-${minutes} min</text>
      <text class="tick" x="${W - PAD.right}" y="${H - 4}" text-anchor="end">now</text>
      ${lines}
    </svg>
    ${series.length ? `<ul class="legend">${latest}</ul>` : `<p class="muted">${esc(empty)}</p>`}
  </figure>`;
}

// Activity: the cluster over the last minutes. Charts of tokens/s, time to first token,
// requests in flight and queued per instance, memory and accelerator use per node (from
// every node's telemetry in the snapshots, `history.js`), and a timeline of the cluster's
// events (when this node applied them).
import { onSnapshot } from "./store.js";
import { esc, setHtml } from "./format.js";
import { lineChart } from "./charts.js";
import { WINDOW_MS, perInstance, perNode, remember, sampleOf, timeToFirstToken, tokensPerSecond } from "./history.js";

const REDRAW_MS = 2000;

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

function describe(fields) {
  return Object.entries(fields || {}).map(([k, v]) => `${k}=${typeof v === "string" && v.length > 14 ? v.slice(0, 8) : v}`).join(" ");
}

function timeline(events, now) {
  const dated = (events || []).filter((e) => e.at != null && now - e.at * 1000 <= WINDOW_MS);
  const x = (at) => 4 + ((at * 1000 - (now - WINDOW_MS)) / WINDOW_MS) * 712;
  const ticks = dated.map((e) => `<line class="event-tick" x1="${x(e.at).toFixed(1)}" x2="${x(e.at).toFixed(1)}" y1="4" y2="26"><title>${esc(`${clock(e.at)} ${e.type} ${describe(e.fields)}`)}</title></line>`).join("");
  const rows = [...(events || [])].reverse().map((e) => `<li data-event-type="${esc(e.type)}"><time class="mono">${e.at != null ? esc(clock(e.at)) : "earlier"}</time> <b>${esc(e.type)}</b> <span class="muted">${esc(describe(e.fields))}</span></li>`).join("");
  return `<svg class="strip" viewBox="0 0 720 30" role="img" aria-label="${dated.length} events in the last ${WINDOW_MS / 60000} minutes"><line class="axis" x1="4" y1="26" x2="716" y2="26"></line>${ticks}</svg>
    <ol class="timeline scroll">${rows}</ol>`;
}

class SkulkActivity extends HTMLElement {
  connectedCallback() {
    this.history = [];
    this.innerHTML = `<section class="page">
      <h2>Activity</h2>
      <div class="grid charts" data-role="charts"></div>
      <div class="card"><h3>Event timeline</h3><div data-role="timeline"></div></div>
    </section>`;
    this.$ = (role) => this.querySelector(`[data-role="${role}"]`);
    this.off = onSnapshot(this, (snapshot) => {
      this.snapshot = snapshot;
      this.history = remember(this.history, sampleOf(snapshot, Date.now()));
      this.render();
    });
    this.timer = setInterval(() => this.render(), REDRAW_MS);
  }
  disconnectedCallback() { this.off?.(); clearInterval(this.timer); }

  render() {
    if (!this.snapshot || this.hidden) return;
    const now = Date.now(), windowMs = WINDOW_MS, h = this.history;
    setHtml(this.$("charts"), [
      lineChart({ title: "Cluster tokens/s", series: tokensPerSecond(h), now, windowMs }),
      lineChart({ title: "Time to first token", unit: " s", series: timeToFirstToken(h), now, windowMs }),
      lineChart({ title: "In flight per instance", series: perInstance(h, "inFlight"), now, windowMs }),
      lineChart({ title: "Queued per instance", series: perInstance(h, "queueDepth"), now, windowMs }),
      lineChart({ title: "Memory used per node", unit: "%", series: perNode(h, "memoryUsed"), now, windowMs, max: 100 }),
      lineChart({ title: "Accelerator use per node", unit: "%", series: perNode(h, "gpuUse"), now, windowMs, max: 100,
        empty: "no node reports an accelerator's use (NVML)" }),
    ].map((chart) => `<div class="card">${chart}</div>`).join(""));
    setHtml(this.$("timeline"), timeline(this.snapshot.events, now));
  }
}
customElements.define("skulk-activity", SkulkActivity);

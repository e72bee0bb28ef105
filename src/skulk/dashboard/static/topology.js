// Topology: the graph of nodes and their edges (master marked, colour = health, a live
// fabric session drawn solid and a verified probe dashed), every placed model's shards (which
// layers sit on which node, a llama.cpp pool's driver and donors), and one card per node
// with memory, accelerators, backends, runners and health detail (problem + fix).
import { onSnapshot } from "./store.js";
import { accelerators, esc, gib, nodeLevel, nodeName, setHtml, short } from "./format.js";

const LEVEL_LABEL = { ok: "healthy", info: "healthy", warn: "warning", error: "unhealthy" };
// A node that leaves the cluster (pruned within a second or two of its death) stays on the
// page this long, red, saying so: an operator glancing at the page sees what happened.
const LOST_SHOWN_MS = 15000;
const LOST_REASON = {
  message: "left the cluster: its presence and heartbeats stopped, and the master pruned it (its instances are re-placed)",
  remediation: "check the node's process and network; it rejoins on its own when it comes back",
};

function layout(ids) {
  const cx = 200, cy = 120, r = ids.length > 1 ? 85 : 0;
  return Object.fromEntries(ids.map((id, i) => {
    const angle = (2 * Math.PI * i) / ids.length - Math.PI / 2;
    return [id, { x: cx + r * Math.cos(angle), y: cy + r * Math.sin(angle) }];
  }));
}

function graph(cluster, state) {
  const ids = cluster.nodes.map((n) => n.nodeId);
  const at = layout(ids);
  const seen = new Set();
  const edges = (state.edges || []).filter((e) => at[e.source] && at[e.sink]).filter((e) => {
    const key = [e.source, e.sink].sort().join("|");
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
  const lines = edges.map((e) => `<line class="edge kind-${esc(e.kind || "session")}" x1="${at[e.source].x}" y1="${at[e.source].y}" x2="${at[e.sink].x}" y2="${at[e.sink].y}"><title>${esc(e.kind || "edge")}</title></line>`);
  const dots = cluster.nodes.map((n) => {
    const p = at[n.nodeId];
    const master = n.nodeId === cluster.masterNodeId;
    return `<g class="gnode level-${nodeLevel(state, n)}" data-node-id="${esc(n.nodeId)}">
      ${master ? `<circle class="master-ring" cx="${p.x}" cy="${p.y}" r="27"></circle>` : ""}
      <circle cx="${p.x}" cy="${p.y}" r="21"></circle>
      <text x="${p.x}" y="${p.y + 42}" text-anchor="middle">${esc(n.name || short(n.nodeId))}${master ? " ★" : ""}</text>
    </g>`;
  });
  return `<svg viewBox="0 0 400 260" role="img" aria-label="Cluster graph: ${cluster.nodes.length} nodes, ${edges.length} edges">${lines.join("")}${dots.join("")}</svg>`;
}

// Which layers of each placed model sit on which node: one bar per instance, a segment per
// shard sized by its layers. A multi-node llama.cpp instance is a pool: rank 0 drives, the
// others donate their memory and compute over ggml RPC.
function role(instance, shard) {
  if (instance.shards.length === 1) return "whole model";
  if (shard.backend.startsWith("llama_cpp")) return shard.rank === 0 ? "pool driver" : "pool donor";
  return `rank ${shard.rank}`;
}

function placements(state) {
  const instances = Object.values(state.instances || {}).sort((a, b) => a.modelId.localeCompare(b.modelId));
  if (!instances.length) return '<p class="muted">No model is placed.</p>';
  return instances.map((inst) => {
    const shards = [...inst.shards].sort((a, b) => a.startLayer - b.startLayer);
    const total = Math.max(1, ...shards.map((s) => s.endLayer)) - Math.min(...shards.map((s) => s.startLayer));
    const segments = shards.map((s) => {
      const layers = s.endLayer - s.startLayer;
      const name = nodeName(state, s.nodeId);
      const text = `${name}: layers ${s.startLayer}-${s.endLayer - 1} (${role(inst, s)}, ${s.backend})`;
      return `<span class="shard k${s.rank % 4}" style="flex:${layers}" title="${esc(text)}" data-node-id="${esc(s.nodeId)}">${esc(name)} ${layers}/${total}</span>`;
    }).join("");
    return `<div class="placement" data-instance-id="${esc(inst.instanceId)}"><h4>${esc(inst.modelId)} <span class="muted">${esc(inst.sharding)}, ${shards.length} ${shards.length === 1 ? "node" : "nodes"}</span></h4>
      <div class="shards" role="img" aria-label="${esc(shards.map((s) => `${nodeName(state, s.nodeId)} holds layers ${s.startLayer} to ${s.endLayer - 1}`).join("; "))}">${segments}</div></div>`;
  }).join("");
}

// The node's background build of a native llama-server (NodeResources.engineProvision).
function engineBuild(build) {
  if (!build) return "";
  const pct = build.total ? ` ${Math.floor((100 * build.done) / build.total)}%` : "";
  const text = {
    building: `building a native llama-server (${build.backend}): ${build.step || "starting"}${pct}; the bundled one serves meanwhile`,
    ready: `native llama-server (${build.backend}) ready: new placements use it`,
  }[build.state] || build.message;
  return `<p class="engine-build" data-state="${esc(build.state)}" title="${esc(build.message || "")}">${esc(text)}</p>`;
}

function nodeCard(cluster, state, node) {
  const level = node.lost ? "error" : nodeLevel(state, node);
  const health = state.nodeHealth?.[node.nodeId] || { reasons: [] };
  const reasons = node.lost ? [LOST_REASON] : [...(health.reasons || [])];
  if (node.alive === false && !reasons.length) reasons.push({ message: "no heartbeat: the node looks down", remediation: "check the node's process and network" });
  const memory = node.memory || {};
  const used = memory.total ? Math.round(100 * (1 - (memory.available || 0) / memory.total)) : 0;
  const runners = Object.values(state.instances || {}).flatMap((inst) => (inst.shards || [])
    .filter((s) => s.nodeId === node.nodeId)
    .map((s) => `<li>${esc(inst.modelId)} <span class="muted">rank ${s.rank}</span> <span class="runner-state">${esc(state.runners?.[s.runnerId]?.state || "Pending")}</span></li>`));
  const detail = reasons.map((r) => `<li>${esc(r.message)}${r.remediation ? ` <em>Fix: ${esc(r.remediation)}</em>` : ""}</li>`).join("");
  const title = reasons.map((r) => `${r.message}${r.remediation ? ` (fix: ${r.remediation})` : ""}`).join("\n");
  const master = node.nodeId === cluster.masterNodeId;
  return `<article class="card node-card level-${level}" data-node-id="${esc(node.nodeId)}" data-node-name="${esc(node.name)}">
    <header><h3>${esc(node.name || short(node.nodeId))}</h3>
      ${master ? '<span class="pill master">master</span>' : ""}
      <span class="badge level-${level}" title="${esc(title)}" tabindex="0">${LEVEL_LABEL[level] || level}</span></header>
    <p class="muted mono">${esc(node.nodeId)}</p>
    <div class="meter" role="meter" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${used}" aria-label="memory used"><span style="width:${used}%"></span></div>
    <p>memory ${gib(memory.available)} free of ${gib(memory.total)}</p>
    <p>accelerators: ${esc(accelerators(node.backends).join(", ") || "-")}</p>
    <p>backends: ${esc((node.backends || []).join(", ") || "-")}</p>
    ${engineBuild(node.engineProvision)}
    <h4>runners</h4>${runners.length ? `<ul class="runners">${runners.join("")}</ul>` : '<p class="muted">none</p>'}
    ${detail ? `<ul class="health-detail">${detail}</ul>` : ""}
  </article>`;
}

class SkulkTopology extends HTMLElement {
  connectedCallback() {
    this.innerHTML = `<section class="page"><h2>Topology</h2><div class="graph card"></div>
      <div class="card placements"><h3>Placed models</h3><div data-role="placements"></div></div><div class="grid nodes"></div></section>`;
    this.lost = new Map(); // nodeId -> { node, at }: nodes seen before that left the cluster
    this.previous = [];
    this.off = onSnapshot(this, (snapshot) => {
      this.track(snapshot.cluster.nodes);
      this.snapshot = snapshot;
      this.render();
    });
  }
  track(nodes) {
    const now = Date.now();
    const present = new Set(nodes.map((n) => n.nodeId));
    for (const node of this.previous) {
      if (!present.has(node.nodeId) && !this.lost.has(node.nodeId)) this.lost.set(node.nodeId, { node, at: now });
    }
    for (const id of present) this.lost.delete(id);
    this.previous = nodes;
  }
  render() {
    const { cluster, state } = this.snapshot;
    const now = Date.now();
    for (const [id, entry] of this.lost) if (now - entry.at >= LOST_SHOWN_MS) this.lost.delete(id);
    const lost = [...this.lost.values()].map(({ node }) => ({ ...node, alive: false, lost: true }));
    setHtml(this.querySelector(".graph"), graph(cluster, state));
    setHtml(this.querySelector('[data-role="placements"]'), placements(state));
    setHtml(this.querySelector(".nodes"), [...cluster.nodes, ...lost].map((n) => nodeCard(cluster, state, n)).join(""));
    clearTimeout(this.expiry);
    if (lost.length) this.expiry = setTimeout(() => this.render(), 1000);
  }
  disconnectedCallback() { this.off?.(); clearTimeout(this.expiry); }
}
customElements.define("skulk-topology", SkulkTopology);

// What the snapshots said over the last minutes, for the Activity page's charts. Pure
// functions over plain data: `sampleOf` reads one snapshot, `remember` keeps a bounded
// window of samples, and the series functions turn counters into rates. Every node's
// telemetry carries its serving totals since it started (`nodeResources[].serving`), so
// rates are differences over a sliding window, summed over nodes; a node whose totals went
// down restarted, and its drop is not counted.

export const WINDOW_MS = 10 * 60 * 1000;
export const MAX_SAMPLES = 600;
export const RATE_WINDOW_MS = 15000;

export function sampleOf(snapshot, t) {
  const { cluster, state } = snapshot;
  const names = Object.fromEntries(cluster.nodes.map((n) => [n.nodeId, n.name || n.nodeId.slice(0, 8)]));
  const nodes = {};
  const instances = {};
  for (const [nodeId, r] of Object.entries(state.nodeResources || {})) {
    const serving = r.serving || {};
    const memory = r.memory || {};
    const gpus = r.gpus || [];
    const utilised = gpus.filter((g) => g.utilizationPercent != null);
    nodes[nodeId] = {
      name: names[nodeId] || r.nodeName || nodeId.slice(0, 8),
      tokens: serving.generatedTokens || 0,
      ttftSum: serving.ttftSecondsSum || 0,
      ttftCount: serving.ttftCount || 0,
      memoryUsed: memory.ramTotalBytes ? 100 * (1 - memory.ramAvailableBytes / memory.ramTotalBytes) : null,
      gpuUse: utilised.length ? utilised.reduce((sum, g) => sum + g.utilizationPercent, 0) / utilised.length : null,
    };
    for (const [instanceId, load] of Object.entries(serving.instances || {})) {
      const entry = instances[instanceId] ||= { inFlight: 0, queueDepth: 0 };
      entry.inFlight += load.inFlight || 0;
      entry.queueDepth += load.queueDepth || 0;
    }
  }
  const models = Object.fromEntries(Object.entries(state.instances || {}).map(([id, i]) => [id, i.modelId]));
  return { t, nodes, instances, models };
}

export function remember(history, sample) {
  const kept = history.filter((s) => sample.t - s.t <= WINDOW_MS && s.t < sample.t);
  kept.push(sample);
  return kept.slice(-MAX_SAMPLES);
}

function windowStart(history, i) {
  let j = i;
  while (j > 0 && history[i].t - history[j - 1].t <= RATE_WINDOW_MS) j -= 1;
  return j;
}

function increase(later, earlier, field) {
  let total = 0;
  for (const [nodeId, node] of Object.entries(later.nodes)) {
    const before = earlier.nodes[nodeId];
    if (before && node[field] >= before[field]) total += node[field] - before[field];
  }
  return total;
}

// Cluster tokens/s: output tokens every API node streamed, over the sliding window.
export function tokensPerSecond(history) {
  const points = [];
  for (let i = 1; i < history.length; i += 1) {
    const j = windowStart(history, i) === i ? i - 1 : windowStart(history, i);
    const seconds = (history[i].t - history[j].t) / 1000;
    if (seconds > 0) points.push([history[i].t, increase(history[i], history[j], "tokens") / seconds]);
  }
  return [{ name: "cluster", points }];
}

// Mean time to first token (seconds) of the requests whose first token came in the window.
export function timeToFirstToken(history) {
  const points = [];
  for (let i = 1; i < history.length; i += 1) {
    const j = windowStart(history, i) === i ? i - 1 : windowStart(history, i);
    const count = increase(history[i], history[j], "ttftCount");
    points.push([history[i].t, count ? increase(history[i], history[j], "ttftSum") / count : null]);
  }
  return [{ name: "cluster", points }];
}

// One series per instance seen in the window: `field` of its load summed over nodes.
export function perInstance(history, field) {
  const ids = [...new Set(history.flatMap((s) => Object.keys(s.instances)))].sort();
  const label = (id) => `${history.findLast((s) => s.models[id])?.models[id] || "instance"} (${id.slice(0, 6)})`;
  return ids.map((id) => ({ name: label(id), points: history.map((s) => [s.t, s.instances[id]?.[field] ?? 0]) }));
}

// One series per node: `field` (memoryUsed or gpuUse, percent) as it was read.
export function perNode(history, field) {
  const ids = [...new Set(history.flatMap((s) => Object.keys(s.nodes)))].sort();
  return ids
    .map((id) => ({ name: history.findLast((s) => s.nodes[id])?.nodes[id].name || id,
      points: history.filter((s) => s.nodes[id]).map((s) => [s.t, s.nodes[id][field]]) }))
    .filter((series) => series.points.some(([, v]) => v != null));
}

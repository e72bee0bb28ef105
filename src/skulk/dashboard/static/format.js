// Small pure helpers shared by the pages: escaping, units, names, derived facts.

export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

export function gib(bytes) {
  if (bytes == null) return "-";
  return bytes < 1024 ** 3 ? `${(bytes / 1024 ** 2).toFixed(0)} MiB` : `${(bytes / 1024 ** 3).toFixed(1)} GiB`;
}

export function short(id) {
  return String(id || "").slice(0, 8);
}

export function nodeName(state, nodeId) {
  return state.nodes?.[nodeId]?.nodeName || short(nodeId);
}

// Accelerator kinds from backend tags ("llama_cpp-cuda" -> "cuda").
export function accelerators(backends) {
  return [...new Set((backends || []).filter((b) => b.includes("-")).map((b) => b.split("-").pop()))];
}

// A node's effective level: its derived health, or error when the cluster sees it dead.
export function nodeLevel(state, node) {
  const level = state.nodeHealth?.[node.nodeId]?.level || "ok";
  return node.alive === false ? "error" : level;
}

export function runnerStates(state, instance) {
  return (instance.shards || []).map((s) => state.runners?.[s.runnerId]?.state || "Pending");
}

export function instanceServing(state, instance) {
  const states = runnerStates(state, instance);
  return states.length > 0 && states.every((s) => s === "Ready" || s === "Running");
}

// Replace an element's markup only when it changed, so a redraw never steals keyboard
// focus or a half-made selection from controls that did not change.
export function setHtml(element, html) {
  if (element.dataset.html === html) return;
  element.dataset.html = html;
  element.innerHTML = html;
}

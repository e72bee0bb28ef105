// Settings and diagnostics: the cluster-wide tracing switch, this node's and the cluster's
// identity, a join invite for a new machine (shown once, never stored by the page),
// per-node diagnostics (asked for, never polled) and the recent event log.
import { api } from "./api.js";
import { onSnapshot } from "./store.js";
import { esc, setHtml, short } from "./format.js";

class SkulkSettings extends HTMLElement {
  connectedCallback() {
    this.innerHTML = `<section class="page">
      <h2>Settings and diagnostics</h2>
      <p class="error" role="alert" data-role="error"></p>
      <div class="card"><h3>Cluster</h3>
        <label class="switch"><input type="checkbox" data-role="tracing"> Tracing of new requests (cluster-wide)</label>
        <dl data-role="cluster" class="facts"></dl></div>
      <div class="card"><h3>This node</h3>
        <div class="row"><label>Log level <select data-role="log-level">
          <option>DEBUG</option><option>INFO</option><option>WARNING</option><option>ERROR</option></select></label>
          <span class="muted">until the node restarts (then SKULK_LOG_LEVEL applies)</span></div>
        <p class="muted">The model store host and every other setting live in skulk.yaml and apply at the next start;
          their effective values are under Node settings below.</p></div>
      <div class="card"><h3>Field telemetry</h3>
        <label class="switch"><input type="checkbox" data-role="telemetry"> Send anonymous performance and
          reliability samples (counts, timings, versions, hardware class; never prompts, output, names or addresses)</label>
        <p class="muted" data-role="telemetry-status"></p>
        <details data-role="telemetry-details"><summary>What would be sent now</summary>
          <pre data-role="telemetry-preview" class="mono scroll"></pre></details></div>
      <div class="card"><h3>Invite a node</h3>
        <div class="row"><label>Valid for <select data-role="invite-ttl">
          <option value="300">5 minutes</option><option value="900" selected>15 minutes</option>
          <option value="3600">1 hour</option><option value="86400">24 hours</option></select></label>
          <button type="button" data-role="invite">Create a join token</button></div>
        <div data-role="invite-result" hidden>
          <p>On the new machine (single use, until <span data-role="invite-expiry"></span>):</p>
          <pre data-role="invite-command" class="mono scroll"></pre>
          <button type="button" data-role="invite-copy">Copy</button>
          <p class="muted">Redeemed at <span data-role="invite-endpoints"></span>. Keep it out of <code>ps</code>
            with <code>--join-file FILE</code> or <code>--join -</code> (stdin).</p></div></div>
      <div class="card"><h3>Node settings and diagnostics</h3>
        <div class="row"><label>Node <select data-role="diag-node"></select></label>
          <button type="button" data-role="diag-load">Show diagnostics</button></div>
        <dl data-role="node-settings" class="facts"></dl>
        <details><summary>All diagnostics</summary><pre data-role="diagnostics" class="mono scroll"></pre></details></div>
      <div class="card"><h3>Recent events</h3><ol data-role="events" class="events mono scroll" reversed></ol></div>
    </section>`;
    this.$ = (role) => this.querySelector(`[data-role="${role}"]`);
    this.$("tracing").addEventListener("change", (event) => this.setTracing(event.target));
    this.$("diag-load").addEventListener("click", () => this.loadDiagnostics());
    this.$("invite").addEventListener("click", () => this.createInvite());
    this.$("log-level").addEventListener("change", (event) => this.setLogLevel(event.target));
    this.$("telemetry").addEventListener("change", (event) => this.setTelemetry(event.target));
    this.$("telemetry-details").addEventListener("toggle", () => this.loadTelemetryPreview());
    this.loadTelemetry();
    this.loadLogLevel();
    this.$("invite-copy").addEventListener("click", () => navigator.clipboard?.writeText(this.$("invite-command").textContent));
    this.off = onSnapshot(this, (snapshot) => this.render(snapshot));
    this.loadDiagnostics();  // this node's, once; other nodes' when asked
  }
  disconnectedCallback() { this.off?.(); }

  render({ cluster, state, events }) {
    const tracing = this.$("tracing");
    if (!tracing.dataset.pending) tracing.checked = Boolean(state.tracingEnabled);
    const master = cluster.nodes.find((n) => n.nodeId === cluster.masterNodeId);
    const facts = {
      "this node": `${cluster.nodes.find((n) => n.nodeId === cluster.nodeId)?.name || ""} (${cluster.nodeId})`,
      master: master ? `${master.name} (${short(master.nodeId)})` : "electing",
      session: cluster.sessionId || "-", "state hash": short(cluster.stateHash), "last event": cluster.lastEventIdx,
      members: cluster.nodes.length,
    };
    setHtml(this.$("cluster"), Object.entries(facts).map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join(""));
    const select = this.$("diag-node");
    const chosen = select.value || cluster.nodeId;
    setHtml(select, cluster.nodes.map((n) => `<option value="${esc(n.nodeId)}">${esc(n.name || short(n.nodeId))}${n.nodeId === cluster.nodeId ? " (this node)" : ""}</option>`).join(""));
    select.value = chosen;
    setHtml(this.$("events"), [...(events || [])].reverse().map((e) => `<li value="${e.idx}"><b>${esc(e.type)}</b> ${
      Object.entries(e.fields).map(([k, v]) => `${esc(k)}=${esc(typeof v === "string" && v.length > 12 ? short(v) : v)}`).join(" ")}</li>`).join(""));
  }

  async setTracing(box) {
    box.dataset.pending = "1";
    try {
      await api("/v1/tracing", { method: "PUT", body: { enabled: box.checked } });
      this.$("error").textContent = "";
    } catch (error) {
      box.checked = !box.checked;
      this.$("error").textContent = error.message;
    } finally { delete box.dataset.pending; }
  }

  showTelemetry(status) {
    const box = this.$("telemetry");
    box.checked = status.enabled;
    box.disabled = status.disabledByEnv;
    const counters = status.counters || {};
    this.$("telemetry-status").textContent = status.disabledByEnv
      ? `${status.envVariable}=1 is set on this node: telemetry stays off whatever is chosen here.`
      : `${status.enabled ? "On" : "Off"}: ${status.pending} samples pending, ${counters.sentBatches || 0} batches sent to ${status.endpoint}`
        + (status.installId ? ` (install id ${status.installId}: quote it to have what was sent deleted)` : "");
  }

  async loadTelemetry() {
    try { this.showTelemetry(await api("/v1/telemetry")); } catch (error) { this.$("telemetry-status").textContent = error.message; }
  }

  async loadTelemetryPreview() {
    if (!this.$("telemetry-details").open) return;
    try {
      this.$("telemetry-preview").textContent = JSON.stringify((await api("/v1/telemetry/preview")).batch, null, 2);
    } catch (error) { this.$("telemetry-preview").textContent = error.message; }
  }

  async setTelemetry(box) {
    try {
      this.showTelemetry(await api("/v1/telemetry", { method: "PUT", body: { enabled: box.checked } }));
      this.$("error").textContent = "";
    } catch (error) {
      this.$("error").textContent = error.message;
      this.loadTelemetry();
    }
  }

  async loadLogLevel() {
    try {
      this.$("log-level").value = (await api("/v1/diagnostics/log-level")).level;
    } catch (error) { this.$("error").textContent = error.message; }
  }

  async setLogLevel(select) {
    try {
      select.value = (await api("/v1/diagnostics/log-level", { method: "PUT", body: { level: select.value } })).level;
      this.$("error").textContent = "";
    } catch (error) {
      this.$("error").textContent = error.message;
      this.loadLogLevel();
    }
  }

  async createInvite() {
    try {
      const invite = await api("/v1/cluster/invites", { method: "POST", body: { ttlSeconds: Number(this.$("invite-ttl").value) } });
      this.$("invite-command").textContent = `skulk run --join ${invite.token}`;
      this.$("invite-expiry").textContent = new Date(invite.expiresAt * 1000).toLocaleString();
      this.$("invite-endpoints").textContent = invite.apiEndpoints.join(", ");
      this.$("invite-result").hidden = false;
      this.$("error").textContent = "";
    } catch (error) { this.$("invite-result").hidden = true; this.$("error").textContent = error.message; }
  }

  async loadDiagnostics() {
    const nodeId = this.$("diag-node").value;
    const target = this.$("diagnostics");
    try {
      const body = await api(nodeId ? `/v1/diagnostics/cluster/${encodeURIComponent(nodeId)}` : "/v1/diagnostics/node");
      target.textContent = JSON.stringify(body, null, 2);
      const settings = body.settings || {};
      setHtml(this.$("node-settings"), Object.entries(settings).map(([k, v]) =>
        `<dt>${esc(k)}</dt><dd>${esc(typeof v === "object" && v !== null ? JSON.stringify(v) : v)}</dd>`).join(""));
      this.$("error").textContent = "";
    } catch (error) { target.textContent = ""; this.$("error").textContent = error.message; }
  }
}
customElements.define("skulk-settings", SkulkSettings);

// Models: placed instances (runner states, slots, delete), placement with live previews, node
// exclusions and a slot count (offered only where an engine with slots can serve the model),
// the cards this cluster knows with per-node download/staging progress, and hub search + add.
// Card lists and previews are fetched when asked for or when State moves.
import { api } from "./api.js";
import { onSnapshot, store } from "./store.js";
import { esc, gib, nodeName, runnerStates, setHtml, short } from "./format.js";

// The slots an instance serves with: the operator's count, else what each shard was stamped.
function instanceSlots(inst) {
  if (inst.requestedSlots != null) return String(inst.requestedSlots);
  return [...new Set((inst.shards || []).map((s) => s.slots ?? 1))].join("/");
}

function downloadCell(state, nodeId, modelId) {
  const live = state.downloadProgress?.[nodeId]?.[modelId];
  if (live) {
    const pct = live.totalBytes ? Math.floor((100 * live.downloadedBytes) / live.totalBytes) : 0;
    return `<progress max="100" value="${pct}" aria-label="download ${pct}%"></progress> ${pct}%`;
  }
  const status = state.downloads?.[nodeId]?.[modelId];
  if (!status) return "";
  if (status.type === "DownloadStatusCompleted") return `ready (${gib(status.totalBytes)})`;
  if (status.type === "DownloadStatusFailed") return `<span class="error">failed: ${esc(status.errorMessage)}</span>`;
  return "pending";
}

class SkulkModels extends HTMLElement {
  connectedCallback() {
    this.cards = [];
    this.previews = null;
    this.slotChoices = [];
    this.lastIdx = null;
    this.innerHTML = `<section class="page">
      <h2>Models</h2>
      <p class="error" role="alert" data-role="error"></p>
      <div class="card"><h3>Running instances</h3><div data-role="instances"></div></div>
      <div class="card"><h3>Place a model</h3>
        <form data-role="place-form" class="row" novalidate>
          <label>Model <select name="model" data-role="model-select"></select></label>
          <label data-role="slots-field" hidden>Slots <input name="slots" type="number" min="1" step="1" inputmode="numeric" data-role="slots"></label>
          <span class="muted" data-role="slots-hint" hidden></span>
          <button type="button" data-action="refresh-cards" class="ghost">Reload cards</button>
        </form>
        <fieldset><legend>Exclude nodes</legend><div data-role="exclusions" class="row"></div></fieldset>
        <div data-role="previews"></div>
      </div>
      <div class="card"><h3>Known models</h3><div data-role="cards"></div></div>
      <div class="card"><h3>Add from Hugging Face</h3>
        <form data-role="search-form" class="row">
          <label>Search <input name="q" type="search" placeholder="Llama-3.2-1B or a .gguf file name" required></label>
          <button type="submit">Search</button>
        </form>
        <div data-role="search-results"></div>
      </div>
    </section>`;
    this.$ = (role) => this.querySelector(`[data-role="${role}"]`);
    this.addEventListener("click", (event) => this.onClick(event));
    this.$("model-select").addEventListener("change", () => { this.slotChoices = []; this.$("slots").value = ""; this.loadPreviews(); });
    this.$("slots").addEventListener("change", () => this.loadPreviews());
    this.$("place-form").addEventListener("submit", (event) => { event.preventDefault(); this.loadPreviews(); });
    this.$("exclusions").addEventListener("change", () => this.renderPreviews());
    this.$("search-form").addEventListener("submit", (event) => { event.preventDefault(); this.search(); });
    this.off = onSnapshot(this, (snapshot) => this.render(snapshot));
    this.loadCards();
  }
  disconnectedCallback() { this.off?.(); }

  showError(error) { this.$("error").textContent = error ? `${error.code ? `${error.code}: ` : ""}${error.message}` : ""; }

  async loadCards() {
    try {
      this.cards = (await api("/models")).models;
      const select = this.$("model-select");
      const chosen = select.value;
      select.innerHTML = `<option value="">choose a model</option>` + this.cards
        .map((c) => `<option value="${esc(c.modelId)}">${esc(c.modelId)}</option>`).join("");
      select.value = chosen;
      if (store.snapshot) this.render(store.snapshot);
    } catch (error) { this.showError(error); }
  }

  // The slot count typed in the form ("" = each node's setting), sent as the API reads it.
  slots() { return this.$("slots").value.trim(); }

  async loadPreviews() {
    const modelId = this.$("model-select").value;
    this.previews = null;
    if (!modelId) { this.renderSlotField(); this.renderPreviews(); return; }
    const slots = this.slots();
    try {
      const body = await api(`/instance/previews?modelId=${encodeURIComponent(modelId)}${slots ? `&slots=${encodeURIComponent(slots)}` : ""}`);
      this.previews = body.previews;
      this.slotChoices = body.slotChoices || [];
      this.showError(null);
    } catch (error) { this.showError(error); }  // e.g. invalid_slot_setting, naming the bound
    this.renderSlotField();
    this.renderPreviews();
  }

  // The slot field shows only where an engine with slots can serve the chosen model.
  renderSlotField() {
    const offered = this.slotChoices.length > 0 && Boolean(this.$("model-select").value);
    this.$("slots-field").hidden = !offered;
    const hint = this.$("slots-hint");
    hint.hidden = !offered;
    hint.textContent = offered ? this.slotChoices.map((c) => `${c.engine}: ${c.min}-${c.max}, default ${c.default}`).join("; ") : "";
    const most = Math.max(0, ...this.slotChoices.map((c) => c.max));
    if (offered) this.$("slots").max = String(most); else this.$("slots").removeAttribute("max");
  }

  excluded() {
    return [...this.$("exclusions").querySelectorAll("input:checked")].map((i) => i.value);
  }

  renderPreviews() {
    const target = this.$("previews");
    const modelId = this.$("model-select").value;
    if (!modelId || !this.previews) { setHtml(target, ""); return; }
    const state = store.snapshot?.state || {};
    const excluded = new Set(this.excluded());
    const options = this.previews.filter((p) => !p.nodeIds.some((n) => excluded.has(n)));
    if (!options.length) {
      setHtml(target, `<p class="muted">No feasible placement${excluded.size ? " without the excluded nodes" : ""}.</p>`);
      return;
    }
    setHtml(target, `<table class="previews"><thead><tr><th>sharding</th><th>nodes: memory needed / free, layers</th><th>context</th><th></th></tr></thead><tbody>${
      options.map((p, i) => `<tr>
        <td>${esc(p.sharding)}</td>
        <td><ul>${p.shards.map((s) => `<li title="${esc(s.breakdown || "")}">${esc(nodeName(state, s.nodeId))}: ${gib(s.neededBytes)} / ${gib(s.availableBytes)}${s.projectorBytes ? ` <span class="muted">(projector ${gib(s.projectorBytes)})</span>` : ""}, layers ${s.startLayer}-${s.endLayer} <span class="muted">${esc(s.backend)}${s.slots > 1 ? `, <span class="slots">${s.slots} slots</span>` : ""}</span></li>`).join("")}</ul></td>
        <td>${p.contextTokenLimit ?? "-"} tokens</td>
        <td><button data-action="place" data-index="${i}">Place</button></td></tr>`).join("")}</tbody></table>`);
    this.visibleOptions = options;
  }

  render({ cluster, state }) {
    // The card list comes from GET /models; custom cards change through the master, so this
    // node's State may apply an add or remove after the page's own reload ran: reload the
    // list whenever the set of custom cards in State changes.
    const customKey = Object.keys(state.customCards || {}).sort().join("\n");
    if (this.customKey !== undefined && customKey !== this.customKey) this.loadCards();
    this.customKey = customKey;
    const exclusions = this.$("exclusions");
    const checked = new Set(this.excluded());
    setHtml(exclusions, cluster.nodes.map((n) => `<label><input type="checkbox" value="${esc(n.nodeId)}" ${checked.has(n.nodeId) ? "checked" : ""}> ${esc(n.name || short(n.nodeId))}</label>`).join(""));
    const instances = Object.entries(state.instances || {});
    setHtml(this.$("instances"), instances.length ? `<table class="instances"><thead><tr><th>model</th><th>instance</th><th>nodes</th><th>runners</th><th>context</th><th>slots</th><th></th></tr></thead><tbody>${
      instances.map(([id, inst]) => `<tr data-instance-id="${esc(id)}" data-model-id="${esc(inst.modelId)}">
        <td>${esc(inst.modelId)}</td><td class="mono">${esc(short(id))}</td>
        <td>${(inst.shards || []).map((s) => esc(nodeName(state, s.nodeId))).join(", ")}</td>
        <td class="runner-states">${runnerStates(state, inst).map(esc).join(", ")}</td>
        <td>${inst.contextTokenLimit ?? "-"}</td>
        <td class="slots">${esc(instanceSlots(inst))}</td>
        <td><button class="danger" data-action="delete" data-instance-id="${esc(id)}" aria-label="Delete instance of ${esc(inst.modelId)}">Delete</button></td></tr>`).join("")}</tbody></table>`
      : '<p class="muted" data-role="no-instances">No instances placed.</p>');
    const nodes = cluster.nodes;
    setHtml(this.$("cards"), `<table class="cards"><thead><tr><th>model</th><th>size</th><th>origin</th>${nodes.map((n) => `<th>${esc(n.name || short(n.nodeId))}</th>`).join("")}<th></th></tr></thead><tbody>${
      this.cards.map((c) => {
        const custom = c.modelId in (state.customCards || {});
        return `<tr><td>${esc(c.modelId)}${c.repairFailure ? `<div class="error">${esc(c.repairFailure.reason)}</div>` : ""}</td><td>${gib(c.storageSizeBytes)}</td><td>${custom ? "custom" : "built-in"}</td>
          ${nodes.map((n) => `<td>${downloadCell(state, n.nodeId, c.modelId)}</td>`).join("")}
          <td>${custom ? `<button class="ghost" data-action="delete-card" data-model-id="${esc(c.modelId)}">Remove card</button>` : ""}</td></tr>`;
      }).join("")}</tbody></table>`);
    if (this.$("model-select").value && cluster.lastEventIdx !== this.lastIdx) this.loadPreviews();
    else this.renderPreviews();
    this.lastIdx = cluster.lastEventIdx;
  }

  async onClick(event) {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const action = button.dataset.action;
    try {
      if (action === "refresh-cards") await this.loadCards();
      if (action === "place") {
        const option = this.visibleOptions[Number(button.dataset.index)];
        button.disabled = true;
        const slots = this.slots();
        await api("/place_instance", { method: "POST", body: {
          modelId: option.modelId, sharding: option.sharding, minNodes: option.nodeIds.length, excludedNodes: this.excluded(),
          ...(slots ? { slots: Number(slots) } : {}) } });
        button.disabled = false;
      }
      if (action === "delete") {
        button.disabled = true;
        await api(`/instance/${encodeURIComponent(button.dataset.instanceId)}`, { method: "DELETE" });
      }
      if (action === "delete-card") {
        await api(`/models/custom/${button.dataset.modelId}`, { method: "DELETE" });
        await this.loadCards();
      }
      if (action === "add") {
        button.disabled = true;
        button.textContent = "Adding...";
        const added = await api("/models/add", { method: "POST", body: { modelId: button.dataset.modelId } });
        button.textContent = `Added ${added.modelId}`;
        await this.loadCards();
      }
      this.showError(null);
    } catch (error) {
      button.disabled = false;
      this.showError(error);
    }
  }

  async search() {
    const q = this.$("search-form").elements.q.value.trim();
    const target = this.$("search-results");
    target.innerHTML = '<p class="muted">Searching...</p>';
    try {
      const { results } = await api(`/models/search?q=${encodeURIComponent(q)}`);
      target.innerHTML = results.length ? `<table><thead><tr><th>repo</th><th>format</th><th>downloads</th><th></th></tr></thead><tbody>${
        results.map((r) => `<tr><td>${esc(r.modelId)}${r.matchedFile ? `<div class="muted">${esc(r.matchedFile)}</div>` : ""}</td><td>${esc(r.format || "-")}</td><td>${r.downloads ?? 0}</td>
          <td><button data-action="add" data-model-id="${esc(r.modelId)}">Add</button></td></tr>`).join("")}</tbody></table>`
        : `<p class="muted">No models match ${esc(q)}.</p>`;
      this.showError(null);
    } catch (error) { target.innerHTML = ""; this.showError(error); }
  }
}
customElements.define("skulk-models", SkulkModels);

// Chat: a picker over placed models, streamed answers rendered as safe Markdown (reasoning
// collapsed apart), a stop button, TTFT and tokens/s per answer, a visible error when a
// stream fails, and conversations kept in this browser (`conversations.js`). Images can be
// attached, pasted or dropped (for a model that sees, docs/VISION.md): sent as OpenAI
// `image_url` data URLs, kept in the history as small thumbnails only (`images.js`). The
// voice loop (`voice.js`) talks to the chosen chat model over WS /v1/realtime.
import { authHeaders, errorFrom, readSse } from "./api.js";
import { onSnapshot } from "./store.js";
import { esc } from "./format.js";
import { render as markdown } from "./markdown.js";
import { load, newConversation, save, titled } from "./conversations.js";
import { attachable, readImage } from "./images.js";
import "./voice.js";

const DEFAULT_MAX_TOKENS = 512;

class SkulkChat extends HTMLElement {
  connectedCallback() {
    this.conversations = load();
    this.current = this.conversations[0] || newConversation();
    this.controller = null;
    this.innerHTML = `<section class="page chat">
      <h2>Chat</h2>
      <div class="row">
        <label>Model <select data-role="model"></select></label>
        <label>Max tokens <input data-role="max-tokens" type="number" min="1" value="${DEFAULT_MAX_TOKENS}"></label>
        <label>Conversation <select data-role="conversation"></select></label>
        <button type="button" class="ghost" data-role="clear">New chat</button>
        <button type="button" class="ghost" data-role="forget">Delete</button>
      </div>
      <p class="muted" data-role="no-models">Place a model on the Models page to chat with it.</p>
      <skulk-voice data-role="voice"></skulk-voice>
      <ol class="messages" data-role="messages" aria-live="polite"></ol>
      <ul class="attachments" data-role="attachments" aria-label="Attached images"></ul>
      <p class="error" role="alert" data-role="attach-error"></p>
      <form data-role="form" class="composer">
        <button type="button" class="ghost" data-role="attach" title="Attach images (or paste or drop them)">Image</button>
        <input data-role="file" type="file" accept="image/png,image/jpeg,image/webp,image/gif" multiple hidden>
        <label class="grow"><span class="sr-only">Message</span><textarea data-role="input" rows="2" placeholder="Message (Enter sends, Shift+Enter for a new line; paste or drop images)"></textarea></label>
        <button type="submit" data-role="send">Send</button>
        <button type="button" class="danger" data-role="stop" disabled>Stop</button>
      </form>
    </section>`;
    this.$ = (role) => this.querySelector(`[data-role="${role}"]`);
    this.$("form").addEventListener("submit", (event) => { event.preventDefault(); this.send(); });
    this.$("input").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); this.send(); }
    });
    this.attachments = [];
    this.$("attach").addEventListener("click", () => this.$("file").click());
    this.$("file").addEventListener("change", (event) => { this.attach([...event.target.files]); event.target.value = ""; });
    this.$("input").addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
      if (files.length) { event.preventDefault(); this.attach(files); }
    });
    const form = this.$("form");
    form.addEventListener("dragover", (event) => { event.preventDefault(); form.classList.add("dropping"); });
    form.addEventListener("dragleave", () => form.classList.remove("dropping"));
    form.addEventListener("drop", (event) => {
      event.preventDefault();
      form.classList.remove("dropping");
      this.attach([...(event.dataTransfer?.files || [])]);
    });
    this.$("stop").addEventListener("click", () => this.controller?.abort());
    this.$("clear").addEventListener("click", () => this.open(newConversation(this.$("model").value)));
    this.$("forget").addEventListener("click", () => {
      this.conversations = save(this.conversations.filter((c) => c.id !== this.current.id));
      this.open(this.conversations[0] || newConversation(this.$("model").value));
    });
    this.$("conversation").addEventListener("change", (event) => {
      const chosen = this.conversations.find((c) => c.id === event.target.value);
      if (chosen) this.open(chosen);
    });
    this.open(this.current);
    this.off = onSnapshot(this, ({ state }) => this.renderModels(state));
  }
  disconnectedCallback() { this.off?.(); this.controller?.abort(); }

  async attach(files) {
    const error = this.$("attach-error");
    error.textContent = "";
    for (const file of files) {
      const why = attachable(file, this.attachments.length);
      if (why) { error.textContent = why; continue; }
      try {
        this.attachments.push(await readImage(file));
      } catch (failure) {
        error.textContent = `${file.name}: ${failure.message}`;
      }
    }
    this.renderAttachments();
  }

  renderAttachments() {
    const list = this.$("attachments");
    list.replaceChildren(...this.attachments.map((image, index) => {
      const item = document.createElement("li");
      const thumb = document.createElement("img");
      thumb.src = image.thumb;
      thumb.alt = image.name;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "ghost";
      remove.textContent = "×";
      remove.title = `Remove ${image.name}`;
      remove.addEventListener("click", () => { this.attachments.splice(index, 1); this.renderAttachments(); });
      item.append(thumb, remove);
      return item;
    }));
    list.hidden = this.attachments.length === 0;
  }

  open(conversation) {
    if (this.controller) return;
    this.current = conversation;
    this.$("messages").replaceChildren();
    for (const message of conversation.messages) {
      const item = this.bubble(message.role, message.content, message.thumbs);
      if (message.reasoning) this.showReasoning(item, message.reasoning);
      if (message.stats) item.querySelector(".stats").textContent = message.stats;
      item.dataset.state = "done";
    }
    if (conversation.model && [...this.$("model").options].some((o) => o.value === conversation.model)) {
      this.$("model").value = conversation.model;
    }
    this.renderConversations();
  }

  renderConversations() {
    const listed = this.conversations.some((c) => c.id === this.current.id) ? this.conversations : [this.current, ...this.conversations];
    const select = this.$("conversation");
    select.innerHTML = listed.map((c) => `<option value="${esc(c.id)}">${esc(c.title)}</option>`).join("");
    select.value = this.current.id;
  }

  remember() {
    this.current = titled({ ...this.current, updated: Date.now() });
    this.conversations = save([this.current, ...this.conversations.filter((c) => c.id !== this.current.id)]);
    this.renderConversations();
  }

  renderModels(state) {
    const select = this.$("model");
    const models = [...new Set(Object.values(state.instances || {}).map((i) => i.modelId))].sort();
    const chosen = select.value || this.current.model;
    const current = [...select.options].map((o) => o.value).join("|");
    if (current !== models.join("|")) {
      select.innerHTML = models.map((m) => `<option value="${esc(m)}">${esc(m)}</option>`).join("");
      if (models.includes(chosen)) select.value = chosen;
    }
    this.$("no-models").hidden = models.length > 0;
  }

  bubble(role, text, thumbs = []) {
    const item = document.createElement("li");
    item.className = `message ${role}`;
    item.innerHTML = `<div class="who">${role}</div><div class="images"></div><details class="reasoning" hidden><summary>reasoning</summary><div class="reasoning-text"></div></details><div class="text"></div><div class="stats muted"></div><div class="error" role="alert"></div>`;
    item.querySelector(".images").replaceChildren(...(thumbs || []).map((src) => {
      const image = document.createElement("img");
      image.src = src;
      image.alt = "attached image";
      return image;
    }));
    this.setText(item, text);
    this.$("messages").append(item);
    return item;
  }

  setText(item, text) {
    const target = item.querySelector(".text");
    if (item.classList.contains("assistant")) {
      target.classList.add("markdown");
      target.replaceChildren(markdown(text));
    } else {
      target.textContent = text;
    }
  }

  showReasoning(item, reasoning) {
    const box = item.querySelector(".reasoning");
    box.hidden = false;  // collapsed until opened
    box.querySelector(".reasoning-text").textContent = reasoning;
  }

  async send() {
    const input = this.$("input");
    const model = this.$("model").value;
    const text = input.value.trim();
    const images = this.attachments;
    if ((!text && !images.length) || !model || this.controller) return;
    input.value = "";
    this.attachments = [];
    this.renderAttachments();
    const thumbs = images.map((i) => i.thumb);
    this.bubble("user", text, thumbs);
    // `images` (the full data URLs) live in memory for this page only; the kept history has
    // the thumbnails, which a later turn sends in their place.
    const turn = images.length ? { role: "user", content: text, images: images.map((i) => i.url), thumbs } : { role: "user", content: text };
    this.current = { ...this.current, model, messages: [...this.current.messages, turn] };
    const answer = this.bubble("assistant", "");
    answer.dataset.state = "streaming";
    const body = { model, messages: this.current.messages.map(wireMessage), stream: true,
      stream_options: { include_usage: true }, max_tokens: Number(this.$("max-tokens").value) || DEFAULT_MAX_TOKENS };
    this.controller = new AbortController();
    this.$("stop").disabled = false;
    this.$("send").disabled = true;
    const started = performance.now();
    let first = null, last = null, tokens = 0, content = "", reasoning = "", usage = null;
    try {
      const response = await fetch("/v1/chat/completions", { method: "POST", signal: this.controller.signal,
        headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }), body: JSON.stringify(body) });
      if (!response.ok) throw errorFrom(response.status, await response.text());
      await readSse(response, ({ data }) => {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw errorFrom(0, JSON.stringify(chunk));
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices?.[0]?.delta || {};
        if (delta.content || delta.reasoning_content) {
          last = performance.now();
          first ??= last;
          tokens += 1;
        }
        if (delta.reasoning_content) {
          reasoning += delta.reasoning_content;
          this.showReasoning(answer, reasoning);
        }
        if (delta.content) {
          content += delta.content;
          this.setText(answer, content);
        }
      });
      answer.dataset.state = "done";
    } catch (error) {
      if (error.name === "AbortError") {
        answer.dataset.state = "stopped";
        answer.querySelector(".stats").textContent = "stopped";
      } else {
        answer.dataset.state = "failed";
        answer.querySelector(".error").textContent = `${error.code ? `${error.code}: ` : ""}${error.message}`;
      }
    } finally {
      this.controller.abort(); // closes a stream that ended in an error frame
      this.controller = null;
      this.$("stop").disabled = true;
      this.$("send").disabled = false;
    }
    if (first !== null) {
      const count = usage?.completion_tokens ?? tokens;
      const seconds = Math.max((last - first) / 1000, 1e-3);
      const rate = count > 1 ? ((count - 1) / seconds).toFixed(1) : "-";
      const stats = answer.querySelector(".stats");
      stats.textContent = `${stats.textContent ? `${stats.textContent} · ` : ""}TTFT ${Math.round(first - started)} ms · ${rate} tok/s · ${count} tokens`;
    }
    const messages = [...this.current.messages];
    if (content) messages.push({ role: "assistant", content, reasoning, stats: answer.querySelector(".stats").textContent });
    else messages.pop();
    this.current = { ...this.current, messages };
    this.remember();
  }
}
// A kept message as the OpenAI chat format sends it: text, then its images as `image_url`
// parts (the full image while this page holds it, else the kept thumbnail).
function wireMessage({ role, content, images, thumbs }) {
  const urls = images || thumbs || [];
  if (!urls.length) return { role, content };
  const parts = content ? [{ type: "text", text: content }] : [];
  return { role, content: [...parts, ...urls.map((url) => ({ type: "image_url", image_url: { url } }))] };
}

customElements.define("skulk-chat", SkulkChat);

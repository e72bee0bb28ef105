// The chat page's voice loop over WS /v1/realtime (docs/REALTIME.md): the microphone,
// captured by an AudioWorklet and resampled to 24 kHz PCM16, streams to the node; the
// transcript shows as it arrives; with a chat model and a voice model picked, the answer
// is shown and spoken. "Hold to talk" commits when released; "Hands-free" lets the
// server's VAD find the turns (and speaking over an answer stops it). Audio stays in this
// page and the node's memory; nothing is kept.
import { api, apiKey } from "./api.js";
import { onSnapshot } from "./store.js";
import { esc } from "./format.js";

export const WIRE_RATE = 24000;
const SEND_SAMPLES = 2400; // 100 ms per append

// A streaming linear resampler: Float32 blocks at `fromRate` in, Int16 samples at `toRate` out.
export function resampler(fromRate, toRate = WIRE_RATE) {
  const step = fromRate / toRate;
  let t = 0, last = 0; // t: next output's input position, relative to the block (>= -1: between `last` and block[0])
  return (block) => {
    const out = [];
    const n = block.length;
    while (t <= n - 1) {
      const i = Math.floor(t), frac = t - i;
      const a = i < 0 ? last : block[i];
      const b = i + 1 < n ? block[i + 1] : a;
      const v = a + (b - a) * frac;
      out.push(Math.max(-32768, Math.min(32767, Math.round(v * 32767))));
      t += step;
    }
    t -= n;
    if (n) last = block[n - 1];
    return Int16Array.from(out);
  };
}

function toBase64(int16) {
  const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function fromBase64(text) {
  const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  return new Int16Array(bytes.buffer, 0, bytes.length >> 1);
}

class SkulkVoice extends HTMLElement {
  connectedCallback() {
    this.innerHTML = `<div class="row voice">
        <label>Speech model <select data-voice="stt"></select></label>
        <label>Voice <select data-voice="tts"><option value="">(text answer only)</option></select></label>
        <label><input type="checkbox" data-voice="vad"> Hands-free</label>
        <label><input type="checkbox" data-voice="answer" checked> Answer with the chat model</label>
        <button type="button" data-voice="talk" disabled>Hold to talk</button>
        <span class="muted" data-voice="status" role="status"></span>
      </div>
      <div class="voice-log">
        <p><span class="muted">You said:</span> <span data-voice="heard"></span></p>
        <p><span class="muted">Answer:</span> <span data-voice="answer-text"></span></p>
        <p class="error" role="alert" data-voice="error"></p>
      </div>`;
    this.$ = (role) => this.querySelector(`[data-voice="${role}"]`);
    this.socket = null;
    this.capture = null;
    this.playing = [];
    const talk = this.$("talk");
    talk.addEventListener("pointerdown", () => { if (!this.$("vad").checked) this.start(); });
    talk.addEventListener("pointerup", () => { if (!this.$("vad").checked) this.stop(true); });
    talk.addEventListener("pointerleave", () => { if (!this.$("vad").checked && this.capture) this.stop(true); });
    talk.addEventListener("click", () => {
      if (!this.$("vad").checked) return;
      if (this.capture) this.stop(false); else this.start();
    });
    this.$("vad").addEventListener("change", () => {
      talk.textContent = this.$("vad").checked ? "Start listening" : "Hold to talk";
      this.stop(false);
    });
    this.placed = "";
    this.off = onSnapshot(this, ({ state }) => this.renderModels(state));
  }
  disconnectedCallback() { this.off?.(); this.stop(false); }

  async renderModels(state) {
    const placed = [...new Set(Object.values(state.instances || {}).map((i) => i.modelId))].sort().join("|");
    if (placed === this.placed) return;
    this.placed = placed;
    let cards = [];
    try { cards = (await api("/models")).models.filter((c) => c.instances?.length); } catch { return; }
    const stt = cards.filter((c) => c.capabilities.includes("stt") && c.audio?.supportsRealtime);
    const tts = cards.filter((c) => c.capabilities.includes("tts"));
    this.chatModels = new Set(cards.filter((c) => c.capabilities.includes("text")).map((c) => c.modelId));
    const fill = (select, list, empty) => {
      const chosen = select.value;
      select.innerHTML = (empty === null ? "" : `<option value="">${esc(empty)}</option>`)
        + list.map((c) => `<option value="${esc(c.modelId)}">${esc(c.modelId)}</option>`).join("");
      if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
    };
    fill(this.$("stt"), stt, null);
    fill(this.$("tts"), tts, "(text answer only)");
    this.$("talk").disabled = stt.length === 0;
    this.$("status").textContent = stt.length ? "" : "Place a realtime speech-to-text model to talk.";
  }

  chatModel() {
    return this.closest("skulk-chat")?.querySelector('[data-role="model"]')?.value || "";
  }

  session() {
    const chat = this.chatModel(), tts = this.$("tts").value;
    // Only a chat model answers (the chat page's picker lists every placed model).
    const response = this.$("answer").checked && this.chatModels?.has(chat)
      ? { model: chat, ...(tts ? { tts_model: tts } : {}), max_output_tokens: 256 } : null;
    return {
      input_audio_format: "pcm16",
      input_audio_transcription: { model: this.$("stt").value },
      turn_detection: this.$("vad").checked ? { type: "server_vad", threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms: 500 } : null,
      response,
    };
  }

  connect() {
    if (this.socket && this.socket.readyState <= WebSocket.OPEN) return this.ready;
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime?intent=transcription`;
    const key = apiKey.get();
    this.socket = new WebSocket(url, key ? ["realtime", `openai-insecure-api-key.${key}`] : undefined);
    this.ready = new Promise((resolve, reject) => {
      this.socket.addEventListener("open", resolve, { once: true });
      this.socket.addEventListener("error", () => reject(new Error("the realtime socket could not open")), { once: true });
    });
    this.socket.addEventListener("message", (message) => this.onEvent(JSON.parse(message.data)));
    this.socket.addEventListener("close", () => { this.socket = null; this.stop(false); });
    return this.ready;
  }

  send(event) {
    if (this.socket?.readyState !== WebSocket.OPEN) return;
    this.socket.send(JSON.stringify(event));
    if (event.type === "input_audio_buffer.append") this.dataset.appended = String(Number(this.dataset.appended || 0) + 1);
  }

  async start() {
    if (this.capture) return;
    this.$("error").textContent = "";
    try {
      await this.connect();
      this.send({ type: "transcription_session.update", session: this.session() });
      this.send({ type: "input_audio_buffer.clear" });
      this.context ??= new AudioContext();
      await this.context.resume();
      const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
      await this.context.audioWorklet.addModule("/static/voice-worklet.js");
      const source = this.context.createMediaStreamSource(stream);
      const node = new AudioWorkletNode(this.context, "skulk-capture");
      const resample = resampler(this.context.sampleRate);
      let pending = [];
      node.port.onmessage = ({ data }) => {
        for (const sample of resample(data)) pending.push(sample);
        if (pending.length >= SEND_SAMPLES) {
          this.send({ type: "input_audio_buffer.append", audio: toBase64(Int16Array.from(pending)) });
          pending = [];
        }
      };
      source.connect(node);
      this.capture = { stream, source, node, flush: () => {
        if (pending.length) this.send({ type: "input_audio_buffer.append", audio: toBase64(Int16Array.from(pending)) });
        pending = [];
      } };
      this.dataset.state = "listening";
      this.$("status").textContent = "listening";
      this.$("talk").textContent = this.$("vad").checked ? "Stop listening" : "Hold to talk";
    } catch (failure) {
      this.$("error").textContent = failure.message || String(failure);
      this.stop(false);
    }
  }

  stop(commit) {
    const capture = this.capture;
    this.capture = null;
    if (capture) {
      capture.flush();
      capture.node.port.onmessage = null;
      capture.source.disconnect();
      capture.stream.getTracks().forEach((t) => t.stop());
      if (commit) this.send({ type: "input_audio_buffer.commit" });
    }
    if (this.$("vad")) this.$("talk").textContent = this.$("vad").checked ? "Start listening" : "Hold to talk";
    this.dataset.state = "idle";
    if (this.$("status") && this.$("status").textContent === "listening") this.$("status").textContent = "";
  }

  silence() {
    for (const source of this.playing) { try { source.stop(); } catch { /* already ended */ } }
    this.playing = [];
    this.playAt = 0;
  }

  play(pcm) {
    this.context ??= new AudioContext();
    const buffer = this.context.createBuffer(1, pcm.length, WIRE_RATE);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    this.playAt = Math.max(this.playAt || 0, this.context.currentTime);
    source.start(this.playAt);
    this.playAt += buffer.duration;
    this.playing.push(source);
    source.onended = () => { this.playing = this.playing.filter((s) => s !== source); };
  }

  onEvent(event) {
    const heard = this.$("heard"), answer = this.$("answer-text");
    switch (event.type) {
      case "input_audio_buffer.speech_started":
        this.silence();
        this.$("status").textContent = "hearing speech";
        break;
      case "input_audio_buffer.committed":
        heard.textContent = "";
        heard.dataset.state = "streaming";
        break;
      case "conversation.item.input_audio_transcription.delta":
        heard.textContent += event.delta;
        break;
      case "conversation.item.input_audio_transcription.completed":
        heard.textContent = event.transcript;
        heard.dataset.state = "done";
        break;
      case "conversation.item.input_audio_transcription.failed":
        this.$("error").textContent = event.error?.message || "transcription failed";
        break;
      case "response.created":
        answer.textContent = "";
        answer.dataset.state = "streaming";
        this.dataset.spoken = "0";
        break;
      case "response.text.delta":
      case "response.audio_transcript.delta":
        answer.textContent += event.delta;
        break;
      case "response.audio.delta":
        this.play(fromBase64(event.delta));
        this.dataset.spoken = String(Number(this.dataset.spoken || 0) + fromBase64(event.delta).length);
        break;
      case "response.done":
        answer.dataset.state = event.response.status;
        if (event.response.status !== "completed") this.silence();
        break;
      case "error":
        this.$("error").textContent = `${event.error.code}: ${event.error.message}`;
        break;
      default:
        break;
    }
  }
}

customElements.define("skulk-voice", SkulkVoice);

// The dashboard's only door to the node: JSON calls, the API key, and server-sent events
// read from fetch() (EventSource cannot send the Authorization header).

const KEY_STORAGE = "skulk.apiKey";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const apiKey = {
  get: () => sessionStorage.getItem(KEY_STORAGE) || "",
  set: (key) => sessionStorage.setItem(KEY_STORAGE, key),
  clear: () => sessionStorage.removeItem(KEY_STORAGE),
};

export function authHeaders(extra = {}) {
  const key = apiKey.get();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// Any of the API's error shapes: Skulk/OpenAI {error:{code|type,message}}, Anthropic,
// Ollama {error:"..."}, FastAPI {detail}.
export function errorFrom(status, text) {
  let body;
  try { body = JSON.parse(text); } catch { return new ApiError(status, null, text || `HTTP ${status}`); }
  const error = body && body.error;
  if (error && typeof error === "object") return new ApiError(status, error.code || error.type, error.message);
  if (typeof error === "string") return new ApiError(status, null, error);
  if (typeof body.detail === "string") return new ApiError(status, null, body.detail);
  if (Array.isArray(body.detail)) {
    return new ApiError(status, "invalid_request", body.detail.map((d) => `${d.loc.slice(1).join(".")}: ${d.msg}`).join("; "));
  }
  return new ApiError(status, null, text);
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = authHeaders(body === undefined ? {} : { "Content-Type": "application/json" });
  const response = await fetch(path, { method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  if (!response.ok) throw errorFrom(response.status, text);
  return text ? JSON.parse(text) : null;
}

// Read a text/event-stream body, calling onEvent({event, data}) per event.
export async function readSse(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = val;
        else if (field === "data") data.push(val);
      }
      if (data.length) onEvent({ event, data: data.join("\n") });
    }
  }
}

const RETRY_MIN_MS = 1000;
const RETRY_MAX_MS = 15000;

// Follow GET /v1/events for as long as the page lives: one stream, re-opened with capped
// backoff when it breaks. onStatus gets "live", "reconnecting" or "unauthorized".
export async function followEvents(onSnapshot, onStatus) {
  let delay = RETRY_MIN_MS;
  for (;;) {
    try {
      const response = await fetch("/v1/events", { headers: authHeaders({ Accept: "text/event-stream" }) });
      if (response.status === 401) { onStatus("unauthorized"); return; }
      if (!response.ok) throw errorFrom(response.status, await response.text());
      onStatus("live");
      delay = RETRY_MIN_MS;
      await readSse(response, ({ event, data }) => { if (event === "snapshot") onSnapshot(JSON.parse(data)); });
    } catch (error) {
      console.warn("event stream broke", error);
    }
    onStatus("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, RETRY_MAX_MS);
  }
}

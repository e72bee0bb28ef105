// The dashboard's entry: theme, page switching, the API-key gate, and the one event stream.
import { api, apiKey, followEvents } from "./api.js";
import { publish } from "./store.js";
import "./topology.js";
import "./activity.js";
import "./models.js";
import "./chat.js";
import "./settings.js";

const THEME_STORAGE = "skulk.theme";
const TELEMETRY_ASKED = "skulk.telemetryAsked";
const PAGE_STORAGE = "skulk.page";

function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  localStorage.setItem(THEME_STORAGE, theme);
}

function initialTheme() {
  return localStorage.getItem(THEME_STORAGE) || (matchMedia("(prefers-color-scheme: light)").matches ? "light" : "dark");
}

function showPage(page) {
  for (const tab of document.querySelectorAll("nav [role=tab]")) {
    const selected = tab.dataset.page === page;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
  }
  for (const section of document.querySelectorAll("#pages > [data-page]")) section.hidden = section.dataset.page !== page;
  sessionStorage.setItem(PAGE_STORAGE, page);
}

function initNav() {
  const tabs = [...document.querySelectorAll("nav [role=tab]")];
  for (const tab of tabs) {
    tab.addEventListener("click", () => showPage(tab.dataset.page));
    tab.addEventListener("keydown", (event) => {  // arrow keys move between tabs
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (!step) return;
      const next = tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length];
      next.focus();
      showPage(next.dataset.page);
    });
  }
  showPage(sessionStorage.getItem(PAGE_STORAGE) || "topology");
}

function setStatus(text) {
  const pill = document.getElementById("link-status");
  pill.textContent = text;
  pill.dataset.state = text;
}

// Resolves once the node accepts this tab's key (or needs none); until then nothing but
// the prompt is shown.
async function unlock() {
  const form = document.getElementById("key-prompt");
  for (;;) {
    try {
      await api("/node_id");
      form.hidden = true;
      return;
    } catch (error) {
      if (error.status !== 401) throw error;
      if (apiKey.get()) document.getElementById("key-error").textContent = "That key was refused.";
      apiKey.clear();
      form.hidden = false;
      setStatus("locked");
      document.getElementById("key-input").focus();
      await new Promise((resolve) => form.addEventListener("submit", (event) => {
        event.preventDefault();
        apiKey.set(document.getElementById("key-input").value.trim());
        resolve();
      }, { once: true }));
    }
  }
}

// Asked once per browser (the marker is this browser's own): opting in or dismissing both
// end the question; dismissing collects nothing. The switch stays in Settings.
async function askTelemetryOnce() {
  if (localStorage.getItem(TELEMETRY_ASKED)) return;
  let status;
  try { status = await api("/v1/telemetry"); } catch { return; }
  if (status.enabled || status.disabledByEnv) return;
  const ask = document.getElementById("telemetry-ask");
  ask.hidden = false;
  const answer = (enabled) => async () => {
    localStorage.setItem(TELEMETRY_ASKED, "1");
    ask.hidden = true;
    if (enabled) {
      try { await api("/v1/telemetry", { method: "PUT", body: { enabled: true } }); } catch { /* shown in Settings */ }
    }
  };
  document.getElementById("telemetry-yes").addEventListener("click", answer(true), { once: true });
  document.getElementById("telemetry-no").addEventListener("click", answer(false), { once: true });
}

async function start() {
  applyTheme(initialTheme());
  document.getElementById("theme-toggle").addEventListener("click", () =>
    applyTheme(document.documentElement.dataset.theme === "dark" ? "light" : "dark"));
  initNav();
  for (;;) {
    try {
      await unlock();
    } catch (error) {
      setStatus(`unreachable: ${error.message}`);
      return;
    }
    document.getElementById("pages").hidden = false;
    askTelemetryOnce();
    const stopped = await new Promise((resolve) => followEvents(publish, (status) => {
      setStatus(status);
      if (status === "unauthorized") resolve(status);
    }));
    if (stopped === "unauthorized") {  // the key changed on the node: ask again
      document.getElementById("pages").hidden = true;
      apiKey.clear();
    }
  }
}

start();

// Chat conversations kept in this browser (localStorage), never on the node: a bounded list
// (the newest MAX_CONVERSATIONS, each at most MAX_MESSAGES, the whole at most MAX_BYTES;
// the oldest conversations go first). A message's images are kept as thumbnails only (the
// full images, `images`, live in the page's memory and are never stored). Pure functions
// over plain data plus load/save.

const STORAGE = "skulk.conversations";
export const MAX_CONVERSATIONS = 30;
export const MAX_MESSAGES = 400;
export const MAX_BYTES = 2 * 1024 * 1024;

export function newConversation(model = "") {
  return { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New chat", model,
    updated: Date.now(), messages: [] };
}

export function titled(conversation) {
  const first = conversation.messages.find((m) => m.role === "user");
  const text = first ? (first.content || (first.thumbs?.length ? "Image" : "")) : "";
  return first ? { ...conversation, title: text.replace(/\s+/g, " ").slice(0, 60) } : conversation;
}

// Newest first, bounded in count, messages and bytes.
export function bounded(list) {
  const sorted = [...list].sort((a, b) => b.updated - a.updated).slice(0, MAX_CONVERSATIONS)
    .map((c) => ({ ...c, messages: c.messages.slice(-MAX_MESSAGES).map(({ images, ...kept }) => kept) }));
  while (sorted.length > 1 && JSON.stringify(sorted).length > MAX_BYTES) sorted.pop();
  return sorted;
}

export function load() {
  try {
    const list = JSON.parse(localStorage.getItem(STORAGE) || "[]");
    return Array.isArray(list) ? list.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
  } catch { return []; }
}

export function save(list) {
  const kept = bounded(list);
  try { localStorage.setItem(STORAGE, JSON.stringify(kept)); } catch { /* storage full or off: keep in memory */ }
  return kept;
}

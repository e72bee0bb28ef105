// The latest snapshot from GET /v1/events, shared by every page. Pages listen for
// "snapshot" and redraw their live parts; they never fetch State themselves.
export const store = new EventTarget();
store.snapshot = null;

export function publish(snapshot) {
  store.snapshot = snapshot;
  store.dispatchEvent(new CustomEvent("snapshot", { detail: snapshot }));
}

export function onSnapshot(element, render) {
  const listener = (event) => render(event.detail);
  store.addEventListener("snapshot", listener);
  if (store.snapshot) render(store.snapshot);
  return () => store.removeEventListener("snapshot", listener);
}

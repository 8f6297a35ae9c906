// The dashboard's only door to the service: every /v1 request with the bearer token, the token itself
// (sessionStorage: this tab only, gone when it closes), and server-sent events read from fetch().

const TOKEN_KEY = "weightstream.token";

// Raised by every request the service answers 401: the token is wrong (or was rotated).
export class Refused extends Error {}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

// A token in the fragment (/#token=...) moves to sessionStorage and out of the address bar, so it is
// neither bookmarked nor shown on screen. Fragments are never sent to the server, so it reaches no log.
export function takeTokenFromFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get("token");
  if (given === null) return;
  fragment.delete("token");
  const rest = fragment.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
  if (given) setToken(given);
}

// fetch() with the bearer header; a non-2xx answer raises with the service's own error message.
export async function request(path, options = {}) {
  const headers = { ...(options.headers || {}), Authorization: `Bearer ${token()}` };
  const response = await fetch(path, { ...options, headers, cache: "no-store" });
  if (response.status === 401) throw new Refused("the service refused this token");
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error.message;
    } catch {
      // not our JSON error shape (a proxy's page): the status line says enough
    }
    throw new Error(message);
  }
  return response;
}

export async function getJson(path) {
  return (await request(path)).json();
}

// Server-sent events of `path`, each passed to onEvent as {seq, kind, data}, until the server ends the
// stream (the job has finished) or `signal` aborts it. EventSource cannot send an Authorization header,
// so the stream is read from fetch() and its frames parsed here.
export async function readEvents(path, onEvent, signal) {
  const response = await request(path, { signal, headers: { Accept: "text/event-stream" } });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    // a frame ends at a blank line; our server writes "\n" line ends only, and a frame may be split
    // across reads, so whatever follows the last blank line waits for the next read
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = parseFrame(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
      if (event) onEvent(event);
    }
  }
}

// One SSE frame: "id:", "event:" and "data:" lines (data may span several); ":" lines are comments
// (the server's keepalive). A frame without data is no event.
export function parseFrame(frame) {
  let seq = null;
  let kind = "message";
  const data = [];
  for (const line of frame.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") seq = Number(value);
    else if (field === "event") kind = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { seq, kind, data: JSON.parse(data.join("\n")) } : null;
}

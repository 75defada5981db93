// The REST API as the page calls it: addresses relative to the <base href> the server writes
// (so the page works mounted under a prefix), the bearer token taken once from #token=, JSON
// in and out, and Server-Sent Events read from a fetch response.

const TOKEN_KEY = "segue-token";

// The page's root address (ending in "/"), as the server said in <base href>.
export const ROOT = new URL(document.baseURI).pathname;

// An address of the page or the API, relative to the root ("api/...", "c/<id>").
export function address(relative) {
  return new URL(relative, document.baseURI).href;
}

// A conversation's page, as a path from the server's root ("/c/<id>", "/segue/c/<id>").
export function conversationAddress(id) {
  return `${ROOT}c/${encodeURIComponent(id)}`;
}

// The conversation id in the page's address, or null on the list.
export function conversationInAddress() {
  const path = location.pathname.startsWith(ROOT) ? location.pathname.slice(ROOT.length) : "";
  const match = path.match(/^c\/([^/]+)$/);
  return match ? decodeURIComponent(match[1]) : null;
}

export function takeToken() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

// The bearer token the page was given, or null (a server only this machine reaches needs none).
export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// A request to the API; every one with a body is JSON ("{}" when it has nothing to say), which
// the server requires (a DELETE says all in its address).
export async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  const bearer = sessionStorage.getItem(TOKEN_KEY);
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  const sending = method === "POST" || method === "PUT";
  if (sending) headers["Content-Type"] = "application/json";
  const response = await fetch(address(path), {
    method,
    headers,
    body: sending ? JSON.stringify(body ?? {}) : undefined,
  });
  if (!response.ok) {
    let data = {};
    try {
      data = await response.json();
    } catch {
      // not JSON: the status says enough
    }
    throw new ApiError(response.status, data.error || "http_error", data.message || response.statusText);
  }
  return response;
}

export async function json(method, path, body) {
  return (await call(method, path, body)).json();
}

// Server-Sent Events from a fetch response (EventSource cannot POST or send a bearer token).
export async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { name, data: JSON.parse(data.join("\n")) };
    }
  }
}

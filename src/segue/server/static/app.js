// segue's page: the conversation list (/) and one conversation (/c/{id}), over the REST API.
// Everything rendered goes through textContent (a model's reply may hold HTML), and the state
// from the server is the truth: updates move the page as they come, and each turn's "done"
// reads the conversation back, so a missed update (a reload mid-turn) costs nothing.

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "segue-token";

// --------------------------------------------------------------------------- the API

function token() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
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

async function json(method, path, body) {
  return (await call(method, path, body)).json();
}

// Server-Sent Events from a fetch response (EventSource cannot POST or send a bearer token).
async function* events(response) {
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

function showProblem(error) {
  const problem = $("problem");
  problem.textContent = error instanceof ApiError ? `${error.message}` : `${error}`;
  problem.hidden = false;
}

function clearProblem() {
  $("problem").hidden = true;
}

// --------------------------------------------------------------------------- the list

async function home() {
  $("home").hidden = false;
  document.title = "segue: conversations";
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of await json("GET", "/api/conversations")) {
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = `/c/${encodeURIComponent(conversation.id)}`;
    link.textContent = conversation.id;
    const meta = document.createElement("span");
    meta.className = "meta";
    const used = percent(shownTokens(conversation), conversation.context_window);
    meta.textContent = `${conversation.phase.replaceAll("_", " ")}, ${used}% of the window`;
    item.append(link, meta);
    list.append(item);
  }
  $("create").addEventListener("submit", async (event) => {
    event.preventDefault();
    clearProblem();
    const body = { behavior: $("behavior").value };
    const system = $("system").value.trim();
    if (system) body.system = system;
    const window = Number($("context-window").value);
    if (window) body.context_window = window;
    try {
      const created = await json("POST", "/api/conversations", body);
      location.assign(`/c/${encodeURIComponent(created.id)}`);
    } catch (error) {
      showProblem(error);
    }
  });
}

// --------------------------------------------------------------------------- one conversation

const view = {
  id: null,
  state: null,
  streaming: false, // this tab's own turn is streaming: the watch stream's copy is skipped
  warned: false,
  live: new Map(), // response number -> the element its text streams into
  tools: new Map(), // tool call id -> its element
};

function shownTokens(state) {
  return state.context_tokens ?? state.projected_tokens ?? 0;
}

function percent(tokens, window) {
  return window ? Math.min(100, Math.round((100 * tokens) / window)) : 0;
}

function level(tokens, state) {
  if (tokens >= state.continuation_tokens) return "critical";
  if (tokens >= state.warning_tokens) return "warning";
  return "ok";
}

function setMeter(tokens, window, levelName) {
  const meter = $("meter");
  const used = percent(tokens, window);
  meter.setAttribute("aria-valuenow", String(used));
  meter.setAttribute("aria-valuetext", `${used}% (${tokens.toLocaleString()} of ${window.toLocaleString()} tokens)`);
  meter.querySelector(".fill").style.width = `${used}%`;
  for (const node of [meter, $("meter-label")]) {
    node.classList.remove("level-ok", "level-warning", "level-critical");
    node.classList.add(`level-${levelName}`);
  }
  $("meter-label").textContent = `${used}%`;
}

function note(text, className = "note") {
  const item = document.createElement("li");
  item.className = className;
  item.textContent = text;
  $("messages").append(item);
  return item;
}

const WHO = {
  user: "You",
  assistant: "Assistant",
  tool_result: "Tool result",
  continuation: "Continuation summary",
  checkpoint: "Checkpoint",
  summary: "Summary of the earlier conversation",
};

function renderMessage(message) {
  const item = document.createElement("li");
  item.className = message.kind === "tool_result" ? `tool${message.is_error ? " error" : ""}` : message.kind;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = WHO[message.kind] || message.kind;
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = message.text;
  item.append(who, text);
  for (const toolCall of message.tool_calls) {
    const used = document.createElement("span");
    used.className = "who";
    used.textContent = `Called ${toolCall.name}(${JSON.stringify(toolCall.input)})`;
    item.append(used);
  }
  $("messages").append(item);
}

function renderState(state) {
  view.state = state;
  const phase = state.phase;
  $("title").textContent = `Conversation ${state.id.slice(0, 8)}`;
  $("title").title = state.id;
  $("phase").textContent = `${phase.replaceAll("_", " ")} · ${state.behavior.replaceAll("_", " ")} · ${state.model}`;
  const tokens = shownTokens(state);
  setMeter(tokens, state.context_window, level(tokens, state));
  if (tokens >= state.warning_tokens && phase !== "context_exhausted") showWarning(tokens, state.context_window);

  const exhausted = phase === "context_exhausted";
  $("exhausted").hidden = !exhausted;
  $("summary").textContent = state.summary || "";
  $("failed").hidden = phase !== "failed";
  $("failure").textContent = phase === "failed" ? `${state.error_kind}: ${state.error_message}` : "";
  $("paused").hidden = phase !== "paused";
  $("paused-text").textContent = phase === "paused"
    ? `This conversation is paused${state.paused_reason ? `: ${state.paused_reason}` : ""}. Resume it to go on.`
    : "";
  if (exhausted) $("warning").hidden = true;

  const reason = inputReason(state);
  const text = $("text");
  text.disabled = reason !== null;
  $("send").disabled = reason !== null || view.streaming; // one turn at a time
  $("messages").setAttribute("aria-busy", String(view.streaming || BUSY.has(phase)));
  $("input-reason").hidden = reason === null;
  $("input-reason").textContent = reason || "";
  $("pause").disabled = phase === "paused" || exhausted || phase === "failed";
  $("resume").disabled = phase !== "paused";
  $("cancel").disabled = !BUSY.has(phase);
  $("continue").disabled = phase !== "idle";

  const child = $("child-link");
  child.hidden = !state.child_id;
  if (state.child_id) child.href = `/c/${encodeURIComponent(state.child_id)}`;
  const parent = $("parent-link");
  parent.hidden = !state.parent_id;
  if (state.parent_id) parent.href = `/c/${encodeURIComponent(state.parent_id)}`;
}

const BUSY = new Set(["llm_requesting", "tool_executing", "awaiting_continuation", "awaiting_checkpoint", "compacting"]);

function inputReason(state) {
  switch (state.phase) {
    case "context_exhausted":
      return "This conversation is read-only: its context window is full. Start a new conversation to go on.";
    case "paused":
      return "This conversation is paused. Resume it to send a message.";
    case "failed":
      return state.error_kind === "llm_error" || state.error_kind === "retries_exhausted"
        ? null
        : `This conversation failed (${state.error_kind}). Start a new conversation.`;
    default:
      return BUSY.has(state.phase) && !view.streaming ? "The assistant is busy with this conversation." : null;
  }
}

function showWarning(tokens, window) {
  if (view.warned) return;
  view.warned = true;
  $("warning-text").textContent =
    `The context window is ${percent(tokens, window)}% full. You can continue in a new conversation now, with a summary of this one.`;
  $("warning").hidden = false;
}

async function reload() {
  const [state, messages, snapshots, chain] = await Promise.all([
    json("GET", `/api/conversations/${view.id}`),
    json("GET", `/api/conversations/${view.id}/messages`),
    json("GET", `/api/conversations/${view.id}/snapshots`),
    json("GET", `/api/conversations/${view.id}/lineage`),
  ]);
  view.live.clear();
  view.tools.clear();
  $("messages").replaceChildren();
  for (const message of messages) renderMessage(message);
  renderState(state);
  renderSnapshots(snapshots);
  const place = chain.find((link) => link.id === view.id);
  $("chain-place").textContent = chain.length > 1 && place ? `Part ${place.label} of ${chain.length}` : "";
}

function renderSnapshots(snapshots) {
  const body = $("snapshots").querySelector("tbody");
  body.replaceChildren();
  $("no-snapshots").hidden = snapshots.length > 0;
  for (const snapshot of snapshots) {
    const row = document.createElement("tr");
    const when = snapshot.created_at ? new Date(snapshot.created_at * 1000).toLocaleString() : "";
    const why = snapshot.trigger === "exhaustion" ? "context limit" : snapshot.reason || "paused";
    const tokens = snapshot.context_tokens === null ? "unknown" : `${snapshot.context_tokens.toLocaleString()} / ${snapshot.context_window.toLocaleString()}`;
    for (const cell of [`v${snapshot.version}`, when, why, String(snapshot.session), tokens, `${snapshot.llm_calls} LLM, ${snapshot.tool_calls} tools`]) {
      const td = document.createElement("td");
      td.textContent = cell;
      row.append(td);
    }
    body.append(row);
  }
}

// One update, as it comes (from this tab's turn or from the watch stream).
async function apply(name, update) {
  switch (name) {
    case "user_message":
      if (!view.streaming) renderMessage({ kind: "user", text: update.text, tool_calls: [] });
      break;
    case "text": {
      let target = view.live.get(update.response);
      if (!target) {
        const item = document.createElement("li");
        item.className = "assistant streaming";
        const who = document.createElement("span");
        who.className = "who";
        who.textContent = WHO.assistant;
        target = document.createElement("span");
        target.className = "text";
        item.append(who, target);
        $("messages").append(item);
        view.live.set(update.response, target);
      }
      target.textContent += update.text;
      break;
    }
    case "tool_started":
      view.tools.set(update.id, note(`Running ${update.name}(${JSON.stringify(update.input)})…`, "tool"));
      break;
    case "tool_finished": {
      const item = view.tools.get(update.id) || note("", "tool");
      item.textContent = `${update.name} ${update.is_error ? "failed" : "finished"}: ${update.output.slice(0, 300)}`;
      if (update.is_error) item.classList.add("error");
      break;
    }
    case "occupancy":
      setMeter(update.tokens, update.window, update.level);
      if (update.level !== "ok") showWarning(update.tokens, update.window);
      break;
    case "warning":
      showWarning(update.tokens, update.window);
      break;
    case "retry":
      note(`The model is busy; retrying in ${update.delay_seconds}s (attempt ${update.attempt}).`);
      break;
    case "session":
      note(`A new session started (${update.reason.replaceAll("_", " ")}).`);
      break;
    case "compacted":
      note("Older messages were summarised to make room.");
      break;
    case "notice":
      note(update.effect === "notify_tool_round_limit" ? "The turn reached its limit of tool calls." : update.effect.replaceAll("_", " "));
      break;
    case "exhausted":
    case "failed":
    case "paused":
      break; // the state read at "done" shows them
    case "done":
      await reload();
      break;
    default:
      break;
  }
}

async function send(text) {
  view.streaming = true;
  renderMessage({ kind: "user", text, tool_calls: [] });
  $("text").value = "";
  renderState({ ...view.state, phase: "llm_requesting" });
  try {
    const response = await call("POST", `/api/conversations/${view.id}/messages`, { text });
    for await (const { name, data } of events(response)) await apply(name, data);
  } catch (error) {
    showProblem(error);
    await reload();
  } finally {
    view.streaming = false;
    if (view.state) renderState(view.state);
  }
}

async function watch() {
  for (;;) {
    try {
      const response = await call("GET", `/api/conversations/${view.id}/events`);
      for await (const { name, data } of events(response)) {
        if (!view.streaming) await apply(name, data);
      }
    } catch {
      // the server restarted or the network dropped: read the state, then watch again
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
    try {
      await reload();
    } catch {
      // keep trying
    }
  }
}

async function post(path, body) {
  clearProblem();
  try {
    return await json("POST", `/api/conversations/${view.id}/${path}`, body);
  } catch (error) {
    showProblem(error);
    return null;
  } finally {
    await reload();
  }
}

async function conversation(id) {
  view.id = encodeURIComponent(id);
  $("conversation").hidden = false;
  document.title = "segue: conversation";
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    clearProblem();
    const text = $("text").value;
    if (!text.trim()) {
      showProblem(new Error("Write a message first."));
      return;
    }
    send(text);
  });
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("composer").requestSubmit();
  });
  $("continue").addEventListener("click", () => post("continue"));
  $("cancel").addEventListener("click", () => post("cancel"));
  $("pause").addEventListener("click", () => post("pause", { reason: "paused from the page" }));
  $("resume").addEventListener("click", () => post("resume", {}));
  $("start-new").addEventListener("click", async () => {
    clearProblem();
    try {
      const child = await json("POST", `/api/conversations/${view.id}/children`, {
        seed_with_summary: !$("no-summary").checked,
      });
      location.assign(`/c/${encodeURIComponent(child.id)}`);
    } catch (error) {
      showProblem(error);
    }
  });
  await reload();
  watch();
}

async function main() {
  token();
  try {
    const info = await json("GET", "/api/info");
    $("offline").hidden = !info.offline;
  } catch (error) {
    showProblem(error);
  }
  const match = location.pathname.match(/^\/c\/(.+)$/);
  try {
    if (match) await conversation(decodeURIComponent(match[1]));
    else await home();
  } catch (error) {
    showProblem(error);
  }
}

main();

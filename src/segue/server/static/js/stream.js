// The updates of a conversation as they come: this tab's own turn (the POST's event stream),
// and every turn from the watch stream (another tab's, a resumed session's). The watch stream
// repeats this tab's own turns too; those are skipped there, by their opening user_message.

import { ApiError, call, events } from "./api.js";
import { toNewest } from "./follow.js";
import { note, renderMessage } from "./messages.js";
import { setMeter } from "./meter.js";
import { $, showProblem } from "./ui.js";
import { markPhase, reload, render, showMissing, view } from "./view.js";

const RETRY_WATCH = 1000; // ms before watching again after the stream broke

const CLEARED = {
  clear_tool_uses_20250919: "old tool results",
  clear_thinking_20251015: "old thinking",
};

// A note about what the provider did in this turn: drawn again after the turn's end reads the
// transcript back (which holds no note), until the next turn begins.
function keepNote(text) {
  view.turnNotes.push(text);
  note(text);
}

// What the provider cleared from the context before it answered, as a person reads it.
function editedText(update) {
  const what = CLEARED[update.strategy] || update.strategy;
  const tokens = Number(update.cleared_input_tokens).toLocaleString("en");
  return `The provider cleared ${what} (${update.cleared}) from the context: ${tokens} tokens.`;
}

// What a refused message's error says to the person who wrote it, beside the box it is still in.
function refusal(error, pinned) {
  if (!(error instanceof ApiError)) return `The message was not sent: ${error.message ?? error}`;
  switch (error.code) {
    case "message_too_large":
      if (pinned) return error.message.replace(/^Conversation \S+ rejected the message: /, "");
      return "This message is too long for the conversation's context window: shorten it, or split it into several messages.";
    case "busy":
      return "The assistant is still answering in this conversation: send again when it is done.";
    default:
      return `The message was not sent: ${error.message}`;
  }
}

function showSendProblem(text) {
  $("send-problem").textContent = text;
  $("send-problem").hidden = false;
}

export function clearSendProblem() {
  $("send-problem").hidden = true;
}

async function safeReload() {
  try {
    await reload();
  } catch (error) {
    showProblem(error);
  }
}

// One update, as it comes; `foreign`: from a turn this tab did not start.
async function apply(name, update, foreign) {
  switch (name) {
    case "user_message":
      view.turnNotes = []; // a new turn: the last one's notes have been read
      if (foreign) {
        renderMessage({ kind: "user", text: update.text, pinned: update.pinned });
        markPhase("llm_requesting");
      }
      break;
    case "text":
      view.live.add(update.response, update.text);
      if (foreign && view.state?.phase === "idle") markPhase("llm_requesting");
      break;
    case "tool_started":
      view.tools.set(update.id, note(`Running ${update.name}(${JSON.stringify(update.input)})…`, "tool"));
      if (foreign) markPhase("tool_executing");
      break;
    case "tool_finished": {
      const item = view.tools.get(update.id) || note("", "tool");
      const output = String(update.output ?? "").slice(0, 300);
      item.textContent = `${update.name} ${update.is_error ? "failed" : "finished"}: ${output}`;
      if (update.is_error) item.classList.add("error");
      break;
    }
    case "occupancy":
      view.tokens = update.tokens;
      if (view.state) setMeter(update.tokens, update.window, update.level, view.state);
      render();
      break;
    case "retry":
      note(`The model is busy; retrying in ${update.delay_seconds}s (attempt ${update.attempt}).`);
      break;
    case "session":
      note(`A new session started (${String(update.reason).replaceAll("_", " ")}).`);
      break;
    case "compacted":
      note("Older messages were summarised to make room.");
      break;
    case "fallback":
      keepNote("The provider could not compact this conversation; segue compacts it instead.");
      break;
    case "context_edited":
      keepNote(editedText(update));
      break;
    case "notice":
      note(
        update.effect === "notify_tool_round_limit"
          ? "The turn reached its limit of tool calls."
          : String(update.effect).replaceAll("_", " "),
      );
      break;
    case "done":
    case "reset": // too far behind: what was missed is read from the store
      await safeReload();
      break;
    default:
      break; // warning, exhausted, failed, paused: the state read at "done" shows them
  }
}

// Send what is in the box; it leaves the box only once the server took it.
export async function send() {
  const box = $("text");
  const text = box.value;
  if (!view.state || view.missing || box.disabled || $("send").disabled) return;
  if (!text.trim()) {
    showSendProblem("Write a message first.");
    return;
  }
  clearSendProblem();
  const pinned = $("pin").checked;
  view.turnNotes = [];
  view.streaming = true;
  view.mine += 1; // its copy on the watch stream may come before the POST's answer
  const shown = renderMessage({ kind: "user", text, pinned });
  toNewest(); // one's own message, and the reply to it, in view
  render();
  let response;
  try {
    response = await call("POST", `${view.path}/messages`, pinned ? { text, pinned } : { text });
  } catch (error) {
    view.mine = Math.max(0, view.mine - 1);
    view.streaming = false;
    shown.remove();
    showSendProblem(refusal(error, pinned));
    await safeReload();
    render();
    return;
  }
  box.value = "";
  $("pin").checked = false;
  try {
    for await (const { name, data } of events(response)) {
      // Dropped too far behind: the rest of this turn comes as another tab's would.
      if (name === "reset" && view.skipping === "mine") view.skipping = null;
      await apply(name, data, false);
    }
  } catch (error) {
    showProblem(error);
    await safeReload();
  } finally {
    view.streaming = false;
    render();
  }
}

// Updates that leave the stored conversation as it was (a reply's delta is stored only with
// the whole reply): one of them arriving while the state is read does not make it old.
const PASSING = new Set(["text", "retry", "notice"]);

// Whether a user message on the watch stream is the last one the latest read drew: an update
// that reached this tab after the read (the watch stream runs on its own connection, and another
// server process's turn reaches it a moment later) describes a turn already drawn, and shown
// again it would be shown twice. Only the first user message after a read can be one.
function echoesTheRead(data) {
  const echo = view.echo;
  view.echo = null;
  return echo !== null && echo === data.text;
}

async function watched(name, data) {
  if (name === "user_message") {
    if (view.mine > 0) {
      view.mine -= 1;
      view.skipping = "mine";
      return;
    }
    if (echoesTheRead(data)) {
      view.skipping = "drawn";
      return;
    }
    view.skipping = null;
  }
  if (view.skipping !== null) {
    if (name !== "done" && name !== "reset") return;
    const drawn = view.skipping === "drawn";
    view.skipping = null;
    if (!drawn) return; // this tab's own turn: its own stream reads it back
  }
  if (!PASSING.has(name)) view.overtaken = true;
  await apply(name, data, true);
}

// Watch the conversation for as long as the page shows it; `ready` is called once the first
// watch is in place (or failed), so that what is read next misses no update.
export async function watch(ready) {
  let first = true;
  for (;;) {
    try {
      const response = await call("GET", `${view.path}/events`);
      view.mine = 0;
      view.skipping = view.streaming ? "mine" : null; // the rest of this tab's turn comes here too
      if (first) ready();
      else await safeReload();
      first = false;
      for await (const { name, data } of events(response)) await watched(name, data);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        showMissing();
        if (first) ready();
        return;
      }
    }
    if (first) ready();
    first = false;
    await new Promise((resolve) => setTimeout(resolve, RETRY_WATCH));
  }
}

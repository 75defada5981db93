// One conversation on the page: what the page knows of it (`view`), and drawing it. The state
// read from the server is the truth; updates move the meter and the phase as they come, and
// each turn's "done" reads the conversation back.

import { conversationAddress, json } from "./api.js";
import { toNewest } from "./follow.js";
import { clearMessages, LiveReplies, note, renderMessage } from "./messages.js";
import { levelOf, limitPlan, setMeter, shownTokens, warningText, windowSource } from "./meter.js";
import { renderSnapshots } from "./snapshots.js";
import { $ } from "./ui.js";

export const BUSY = new Set([
  "llm_requesting",
  "tool_executing",
  "awaiting_continuation",
  "awaiting_checkpoint",
  "compacting",
]);
const RECOVERABLE = new Set(["llm_error", "retries_exhausted"]);
// Failures whose context ran out: what the conversation wrote last (a summary, a checkpoint)
// can seed its continuation. Any other failure carries its last exchanges, or nothing.
const CONTEXT_FAILURES = new Set(["context_exhausted", "checkpoint_overflow", "compaction_ineffective", "run_time_limit"]);
const WORKING = {
  awaiting_continuation: "Writing a summary of this conversation…",
  compacting: "Summarising older messages to make room…",
  awaiting_checkpoint: "Writing a checkpoint…",
};

export const view = {
  id: null, // the conversation's id
  path: null, // its API address, relative to the root
  state: null, // the state last read from the server (null until then)
  tokens: 0, // the meter's figure: the state's, or the latest occupancy update's
  streaming: false, // this tab's own turn is streaming
  mine: 0, // own turns whose copy on the watch stream has not begun yet
  skipping: null, // the watch stream repeats a turn already shown: "mine" or "drawn"
  echo: null, // the last user message the latest read drew (a late update may repeat it)
  working: null, // what the page waits for, said while it waits (a summary being written)
  missing: false, // no such conversation
  askingPause: false, // the pause's reason is being asked for
  pauseAsked: false, // this tab asked for a pause the running turn has not reached yet
  navigating: false, // leaving for another conversation
  drawn: false, // the conversation has been drawn once (the first draw shows the newest)
  wroteSummary: false, // its transcript holds a summary or checkpoint (a child can start from)
  live: new LiveReplies(),
  tools: new Map(), // tool call id -> its note
  reloads: 0,
  overtaken: false, // an update from another tab's turn came while the state was being read
  chainLength: 1, // conversations in its continuation chain, itself included
  turnNotes: [], // what the provider did in the last turn (a fallback, what it cleared)
};

// A pause was asked for and waits for the running turn's boundary (said by the stored state,
// or by this tab's own request, which the runtime running the turn holds until its next step).
function pauseWaits(state) {
  return (state.pause_requested || view.pauseAsked) && BUSY.has(state.phase);
}

export function busy() {
  return view.streaming || Boolean(view.working) || (view.state !== null && BUSY.has(view.state.phase));
}

function recoverable(state) {
  return state.phase === "failed" && RECOVERABLE.has(state.error_kind);
}

// Whether the conversation goes on only in a new one (the runtime's start_new_from): read-only
// at its limit, or failed (one whose failure a message recovers from may also take one).
export function continuable(state) {
  return state.phase === "context_exhausted" || state.phase === "failed";
}

// Whether its child would start from a summary or checkpoint it wrote (else from its last
// exchanges, or from nothing: the user's choice). A conversation that failed at its limit
// passes on the last one its transcript holds, as the server does: one that failed before
// writing any has none, and "without the summary" would offer nothing to leave out.
function hasSummary(state) {
  if (state.phase === "context_exhausted") return true;
  return CONTEXT_FAILURES.has(state.error_kind) && view.wroteSummary;
}

const SUMMARIES = new Set(["continuation", "checkpoint", "summary"]);

function inputReason(state) {
  if (view.missing) return "There is no such conversation.";
  if (state === null) return "Loading the conversation…";
  const next = state.child_id ? " It continues in a new conversation." : " Start a new conversation to go on.";
  switch (state.phase) {
    case "context_exhausted":
      return `This conversation is read-only: its context window is full.${next}`;
    case "paused":
      return "This conversation is paused. Resume it to send a message.";
    case "failed":
      return recoverable(state) ? null : `This conversation failed (${state.error_kind}).${next}`;
    default:
      return BUSY.has(state.phase) && !view.streaming ? "The assistant is busy with this conversation." : null;
  }
}

// Draw the state and the meter; the controls follow from them.
export function setState(state) {
  view.state = state;
  if (!BUSY.has(state.phase)) view.pauseAsked = false;
  view.tokens = shownTokens(state);
  render();
}

// The phase an update shows the conversation is in (another tab's turn began, a tool runs).
export function markPhase(phase) {
  if (view.state && view.state.phase !== phase && !view.missing) {
    view.state = { ...view.state, phase };
    render();
  }
}

export function render() {
  const state = view.state;
  renderControls(state);
  if (state === null) return;
  const phase = state.phase;
  $("title").textContent = state.title || "New conversation";
  $("title").title = state.id;
  document.title = `segue: ${state.title || "new conversation"}`;
  $("phase").textContent = [
    phase.replaceAll("_", " "),
    state.behavior.replaceAll("_", " "),
    state.model,
    compactionWords(state),
  ]
    .filter(Boolean)
    .join(" · ");
  setMeter(view.tokens, state.context_window, levelOf(view.tokens, state), state);
  renderWindowSource(state);
  $("delete").hidden = view.missing;
  renderBanners(state);
  placeRedo(state);
  const child = $("child-link");
  child.hidden = !state.child_id;
  if (state.child_id) child.href = conversationAddress(state.child_id);
  const parent = $("parent-link");
  parent.hidden = !state.parent_id;
  if (state.parent_id) parent.href = conversationAddress(state.parent_id);
  $("chain").hidden = !state.child_id && !state.parent_id;
}

// Who compacts a conversation that compacts in place (said once the provider could not).
function compactionWords(state) {
  if (state.compaction_fallback) return "segue compacts (the provider could not)";
  return state.compaction === "provider" ? "the provider compacts" : null;
}

function renderWindowSource(state) {
  const shown = windowSource(state);
  const node = $("window-source");
  node.hidden = shown === null;
  if (shown === null) return;
  node.textContent = shown.text;
  node.title = shown.why;
  node.classList.toggle("assumed", shown.assumed);
}

function renderBanners(state) {
  const phase = state.phase;
  const still = phase !== "context_exhausted" && phase !== "failed" && phase !== "paused";
  const warning = still ? warningText(view.tokens, state) : null;
  const plan = limitPlan(state.behavior);
  $("warning").hidden = warning === null;
  $("warning-text").textContent = warning || "";
  $("continue-form").hidden = warning === null || !plan.action;
  $("continue").textContent = plan.action || "";
  $("continue").disabled = phase !== "idle" || busy();
  $("focus").disabled = $("continue").disabled;

  const pausing = pauseWaits(state) ? "Pausing when this turn ends…" : null;
  const working = view.working || WORKING[phase] || pausing;
  $("working").hidden = working === null;
  $("working-text").textContent = working || "";

  $("exhausted").hidden = phase !== "context_exhausted";
  $("failed").hidden = phase !== "failed";
  $("failure").textContent = phase === "failed" ? `${state.error_kind}: ${state.error_message}` : "";
  $("paused").hidden = phase !== "paused";
  $("paused-text").textContent =
    phase === "paused" ? `This conversation is paused${state.paused_reason ? `: ${state.paused_reason}` : ""}.` : "";
}

// Only the controls the state allows are shown: a read-only conversation keeps its one way
// on, a paused one its Resume, a running turn its Cancel.
function renderControls(state) {
  const reason = inputReason(state);
  const known = state !== null && !view.missing;
  const phase = known ? state.phase : null;
  const writable = reason === null || state === null || BUSY.has(phase);
  $("write").hidden = view.missing || !writable;
  $("pin-choice").hidden = $("write").hidden;
  $("keys").hidden = $("write").hidden;
  $("text").disabled = reason !== null;
  $("pin").disabled = reason !== null;
  $("send").hidden = $("write").hidden;
  $("send").disabled = reason !== null || busy();
  const unread = view.state === null && !view.missing; // the state is still being read
  $("messages").setAttribute("aria-busy", String(busy() || unread));
  // Where the box is gone (read-only, paused), the banner above says why.
  $("input-reason").hidden = reason === null || $("write").hidden;
  $("input-reason").textContent = reason || "";
  const ended = phase === "paused" || phase === "context_exhausted" || phase === "failed";
  const pausable = known && !ended && !pauseWaits(state);
  if (!pausable) view.askingPause = false;
  $("pause").hidden = !pausable || view.askingPause;
  $("pause-ask").hidden = !view.askingPause;
  $("pause-now").disabled = !pausable;
  $("resume").hidden = phase !== "paused";
  $("resume").disabled = Boolean(view.working);
  $("cancel").hidden = !known || !(BUSY.has(phase) || view.streaming);
  $("composer").hidden = view.missing;
  renderNext(state, known);
}

function renderNext(state, known) {
  const goesOn = known && continuable(state);
  $("next").hidden = !goesOn;
  if (!goesOn) return;
  const child = state.child_id;
  $("go-child").hidden = !child;
  if (child) $("go-child").href = conversationAddress(child);
  $("start-child").hidden = Boolean(child);
  $("start-new").disabled = Boolean(child) || Boolean(view.working);
  $("no-summary-choice").hidden = !hasSummary(state);
  $("recent-choice").hidden = hasSummary(state);
}

// "Make this summary again" (and, for a compaction, "Take this compaction back") sits in the
// latest summary the conversation may make again (REQ-SEG-063, 064): a compact_in_place conversation's compaction summary while it is idle, a
// read-only one's continuation summary until a child starts from it. The form is moved, not
// copied (a redraw clears the transcript, so it is kept here); elsewhere it waits hidden.
let redoForm = null;

function placeRedo(state) {
  redoForm ??= $("redo-form");
  const kind = state.phase === "context_exhausted" && !state.child_id ? "continuation"
    : state.phase === "idle" && state.behavior === "compact_in_place" ? "summary" : null;
  // Only the summary that opens the current generation (a compaction's) or ends the session.
  const here = `[data-session="${state.session}"][data-generation="${state.generation}"]`;
  const summaries = kind ? document.querySelectorAll(`#messages li.${kind}${here}`) : [];
  const target = summaries.length ? summaries[summaries.length - 1] : $("redo-home");
  if (redoForm.parentElement !== target) target.append(redoForm);
  const waiting = busy() || Boolean(view.working);
  for (const control of redoForm.querySelectorAll("button, input")) control.disabled = waiting;
  // A compaction can be taken back; a continuation summary can only be made again.
  redoForm.querySelector("#undo").hidden = kind !== "summary";
}

export function showMissing() {
  view.missing = true;
  $("title").textContent = "No such conversation";
  $("missing").hidden = false;
  $("missing-id").textContent = view.id;
  for (const id of ["warning", "working", "exhausted", "failed", "paused", "next", "delete"]) $(id).hidden = true;
  renderControls(null);
}

// Read the conversation back from the server and draw it all; an older read that ends after a
// newer one draws nothing. An update that arrives while it is read (on the watch stream,
// another connection) may describe a change the read came too early to see: what was read is
// drawn, then read again, a few times at most while updates keep coming (the page shows
// something meanwhile, and each turn's "done" reads it once more).
const READS_OVERTAKEN = 3;

export async function reload() {
  for (let read = 1; ; read += 1) {
    const mine = ++view.reloads;
    view.overtaken = false;
    const found = await Promise.all([
      json("GET", view.path),
      json("GET", `${view.path}/messages`),
      json("GET", `${view.path}/snapshots`),
      json("GET", `${view.path}/lineage`),
    ]);
    if (mine !== view.reloads || view.navigating) return;
    draw(...found);
    if (!view.overtaken || read === READS_OVERTAKEN) return;
  }
}

function draw(state, messages, snapshots, chain) {
  view.live.clear();
  view.tools.clear();
  clearMessages();
  for (const message of messages) renderMessage(message);
  for (const text of view.turnNotes) note(text);
  const lastUser = messages.findLast((message) => message.kind === "user");
  view.echo = lastUser ? lastUser.text : null;
  view.wroteSummary = messages.some((message) => SUMMARIES.has(message.kind) && message.text);
  setState(state);
  renderSnapshots(snapshots, view.path);
  view.chainLength = chain.length;
  const place = chain.findIndex((link) => link.id === view.id);
  $("chain-place").textContent = chain.length > 1 && place >= 0 ? `Part ${place + 1} of ${chain.length}` : "";
  if (!view.drawn) {
    view.drawn = true;
    toNewest(); // opened: the newest message in view
  }
}

// The conversation page: its buttons, and opening it (watch first, then read, so that no
// update falls between the two; a first read that fails is tried again, saying so).

import { conversationAddress, json } from "./api.js";
import { wireDelete } from "./delete.js";
import { followMessages, show, toNewest } from "./follow.js";
import { limitPlan } from "./meter.js";
import { wireSnapshots } from "./snapshots.js";
import { clearSendProblem, send, watch } from "./stream.js";
import { $, clearProblem, showProblem } from "./ui.js";
import { reload, render, showMissing, view } from "./view.js";

// What the page says while the conversation's path at the limit is taken by hand.
const WORKING_NOW = {
  threshold_based_continuation: "Writing a summary of this conversation…",
  compact_in_place: "Summarising older messages to make room…",
  checkpoint_restart: "Writing a checkpoint to restart from…",
};
const RECENT_TURNS = 3; // the exchanges a failed conversation's child carries when asked
const FIRST_READ_RETRY = [1000, 2000, 5000]; // ms between attempts at the first read

function go(id) {
  view.navigating = true;
  location.assign(conversationAddress(id));
}

async function post(path, body) {
  clearProblem();
  try {
    return await json("POST", `${view.path}/${path}`, body);
  } catch (error) {
    showProblem(error);
    return null;
  } finally {
    if (!view.navigating) await reload().catch(showProblem);
  }
}

// Take the conversation's path at the limit now, with what the summary (checkpoint,
// compaction) must keep above all when the user said; "continue in a new conversation" lands
// in it.
async function continueNow() {
  const focus = $("focus").value.trim();
  view.working = WORKING_NOW[view.state.behavior] || "Working…";
  render();
  try {
    const after = await json("POST", `${view.path}/continue`, focus ? { focus } : {});
    $("focus").value = "";
    if (after.phase === "context_exhausted") {
      view.working = "Opening the new conversation…";
      render();
      const child = await json("POST", `${view.path}/children`, { seed_with_summary: true });
      go(child.id);
    }
  } catch (error) {
    showProblem(error);
  } finally {
    view.working = null;
    if (!view.navigating) await reload().catch(showProblem);
  }
}

// The latest summary made again from what it replaced, keeping the user's focus above all
// (REQ-SEG-063); the old one stays in the transcript, above the new.
async function redoSummary(form) {
  const input = form.querySelector("input");
  const focus = input.value.trim();
  view.working = "Making the summary again…";
  render();
  try {
    await json("POST", `${view.path}/redo-summary`, focus ? { focus } : {});
    input.value = "";
  } catch (error) {
    showProblem(error);
  } finally {
    view.working = null;
    if (!view.navigating) await reload().catch(showProblem);
  }
}

// The latest compaction taken back (REQ-SEG-064): its history restored when it fits the
// window now; when it does not, the server's answer says by how much.
async function undoCompaction() {
  view.working = "Taking the compaction back…";
  render();
  try {
    await json("POST", `${view.path}/undo-compaction`, {});
  } catch (error) {
    showProblem(error);
  } finally {
    view.working = null;
    if (!view.navigating) await reload().catch(showProblem);
  }
}

// The one way on from an ended conversation: its child, seeded with its summary (or, from a
// failure that wrote none, its last exchanges) unless the user said otherwise.
async function startNew() {
  clearProblem();
  view.working = "Opening the new conversation…";
  render();
  const summary = !$("no-summary-choice").hidden && !$("no-summary").checked;
  const recent = !$("recent-choice").hidden && $("recent").checked ? RECENT_TURNS : 0;
  try {
    const child = await json("POST", `${view.path}/children`, { seed_with_summary: summary, recent_turns: recent });
    go(child.id);
  } catch (error) {
    view.working = null;
    showProblem(error);
    render();
  }
}

async function resume() {
  view.working = "Resuming in a new session…";
  render();
  try {
    await post("resume", {});
  } finally {
    view.working = null;
    render();
  }
}

// The pause asks for its reason in place (kept in the snapshot), then pauses.
function askWhyPause() {
  view.askingPause = true;
  render();
  $("pause-reason").focus();
}

function stopAsking() {
  view.askingPause = false;
  $("pause-reason").value = "";
  render();
}

async function pauseNow() {
  const reason = $("pause-reason").value.trim();
  const answer = await post("pause", { reason });
  if (answer === null) return;
  view.pauseAsked = answer.pause_requested && answer.snapshot_version === null;
  stopAsking();
}

// The continuation summary is the transcript's own message: shown there, where there is room.
function readSummary() {
  const summaries = document.querySelectorAll("#messages li.continuation");
  if (summaries.length) show(summaries[summaries.length - 1]);
}

function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    clearProblem();
    send();
  });
  $("text").addEventListener("keydown", (event) => {
    // Enter sends (as in a chat); Shift+Enter starts a new line; an IME's Enter is its own.
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    $("composer").requestSubmit();
  });
  $("text").addEventListener("input", clearSendProblem);
  $("pin").addEventListener("change", clearSendProblem);
  $("continue-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (limitPlan(view.state?.behavior).action && !$("continue").disabled) continueNow();
  });
  $("cancel").addEventListener("click", () => post("cancel", {}));
  $("pause").addEventListener("click", askWhyPause);
  $("pause-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!$("pause-now").disabled) pauseNow();
  });
  $("pause-back").addEventListener("click", stopAsking);
  $("pause-reason").addEventListener("keydown", (event) => {
    if (event.key === "Escape") stopAsking();
  });
  $("resume").addEventListener("click", resume);
  $("start-new").addEventListener("click", startNew);
  $("read-summary").addEventListener("click", readSummary);
  const redoForm = $("redo-form"); // moved into the transcript's latest summary when it shows
  redoForm.addEventListener("submit", (event) => {
    event.preventDefault();
    clearProblem();
    if (!redoForm.querySelector("#redo").disabled) redoSummary(redoForm);
  });
  redoForm.querySelector("#undo").addEventListener("click", () => {
    clearProblem();
    undoCompaction();
  });
  wireSnapshots();
  wireDelete();
  followMessages();
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The first read, tried again (saying so) until it is answered: a server restarting, a store
// not reachable yet. A conversation that does not exist is said at once.
async function firstRead() {
  for (let attempt = 0; ; attempt += 1) {
    try {
      await reload();
      clearProblem();
      return;
    } catch (error) {
      if (error.status === 404) {
        showMissing();
        return;
      }
      const wait = FIRST_READ_RETRY[Math.min(attempt, FIRST_READ_RETRY.length - 1)];
      showProblem(`The conversation could not be read (${error.message}); trying again in ${wait / 1000} s…`);
      await pause(wait);
    }
  }
}

export async function openConversation(id) {
  view.id = id;
  view.path = `api/conversations/${encodeURIComponent(id)}`;
  document.body.classList.add("in-conversation");
  $("conversation").hidden = false;
  document.title = "segue: conversation";
  wire();
  render(); // everything disabled until the state is read
  await new Promise((ready) => {
    watch(ready);
  });
  if (view.missing) return;
  await firstRead();
  toNewest();
}

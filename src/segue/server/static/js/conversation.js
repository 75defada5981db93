// The conversation page: its buttons, and opening it (watch first, then read, so that no
// update falls between the two).

import { conversationAddress, json, token } from "./api.js";
import { limitPlan } from "./meter.js";
import { clearSendProblem, send, watch } from "./stream.js";
import { $, clearProblem, showProblem } from "./ui.js";
import { reload, render, showMissing, view } from "./view.js";

// What the page says while the conversation's path at the limit is taken by hand.
const WORKING_NOW = {
  threshold_based_continuation: "Writing a summary of this conversation…",
  compact_in_place: "Summarising older messages to make room…",
  checkpoint_restart: "Writing a checkpoint to restart from…",
};

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

async function startNew() {
  clearProblem();
  view.working = "Opening the new conversation…";
  render();
  try {
    const child = await json("POST", `${view.path}/children`, { seed_with_summary: !$("no-summary").checked });
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

function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    clearProblem();
    send();
  });
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("composer").requestSubmit();
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
  $("snapshots").addEventListener("click", showSnapshot);
  $("resume").addEventListener("click", resume);
  $("start-new").addEventListener("click", startNew);
}

// A snapshot's JSON: its link opens the API's answer; with a token (which a plain link cannot
// send) it is read here and shown below the table instead.
async function showSnapshot(event) {
  const link = event.target.closest("a[data-version]");
  if (!link || !token()) return;
  event.preventDefault();
  try {
    const whole = await json("GET", `${view.path}/snapshots/${link.dataset.version}`);
    $("snapshot-shown-title").textContent = `Snapshot v${whole.version}`;
    $("snapshot-json").textContent = JSON.stringify(whole, null, 2);
    $("snapshot-shown").hidden = false;
  } catch (error) {
    showProblem(error);
  }
}

export async function openConversation(id) {
  view.id = id;
  view.path = `api/conversations/${encodeURIComponent(id)}`;
  $("conversation").hidden = false;
  document.title = "segue: conversation";
  wire();
  render(); // everything disabled until the state is read
  await new Promise((ready) => {
    watch(ready);
  });
  if (view.missing) return;
  try {
    await reload();
  } catch (error) {
    if (error.status === 404) showMissing();
    else throw error;
  }
}

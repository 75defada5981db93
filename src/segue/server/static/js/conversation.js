// The conversation page: its buttons, and opening it (watch first, then read, so that no
// update falls between the two).

import { conversationAddress, json } from "./api.js";
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

// Take the conversation's path at the limit now; "continue in a new conversation" lands in it.
async function continueNow() {
  view.working = WORKING_NOW[view.state.behavior] || "Working…";
  render();
  try {
    const after = await json("POST", `${view.path}/continue`, {});
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
  $("continue").addEventListener("click", () => {
    if (limitPlan(view.state?.behavior).action) continueNow();
  });
  $("cancel").addEventListener("click", () => post("cancel", {}));
  $("pause").addEventListener("click", () => post("pause", { reason: "paused from the page" }));
  $("resume").addEventListener("click", resume);
  $("start-new").addEventListener("click", startNew);
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

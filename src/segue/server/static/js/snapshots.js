// A conversation's pause snapshots: a button in the heading when there are any, opening a
// dialog with their table; a snapshot's whole JSON is its link (the API's answer), or, with a
// token (which a plain link cannot send), read here and shown below the table.

import { address, json, token } from "./api.js";
import { $, showProblem } from "./ui.js";

let path = null; // the conversation's API address, relative to the root

// How long a session ran, as a person reads it ("4 s", "2 min 5 s", "1 h 3 min").
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "unknown";
  const whole = Math.floor(seconds);
  if (whole < 60) return `${whole} s`;
  const minutes = Math.floor(whole / 60);
  if (minutes < 60) return `${minutes} min ${whole % 60} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function row(snapshot) {
  const tr = document.createElement("tr");
  const when = snapshot.created_at ? new Date(snapshot.created_at * 1000).toLocaleString() : "";
  const why = snapshot.trigger === "exhaustion" ? "context limit" : snapshot.reason || "paused";
  const tokens =
    snapshot.context_tokens === null
      ? "unknown"
      : `${snapshot.context_tokens.toLocaleString("en")} / ${snapshot.context_window.toLocaleString("en")}`;
  const calls = `${snapshot.llm_calls} LLM, ${snapshot.tool_calls} tools`;
  const cells = [`v${snapshot.version}`, when, why, String(snapshot.session), duration(snapshot.session_seconds), tokens, calls];
  for (const cell of cells) {
    const td = document.createElement("td");
    td.textContent = cell;
    tr.append(td);
  }
  const link = document.createElement("a");
  link.href = address(`${path}/snapshots/${snapshot.version}`);
  link.dataset.version = String(snapshot.version);
  link.textContent = `JSON of v${snapshot.version}`;
  const whole = document.createElement("td");
  whole.append(link);
  tr.append(whole);
  return tr;
}

export function renderSnapshots(snapshots, conversationPath) {
  path = conversationPath;
  $("snapshots").querySelector("tbody").replaceChildren(...snapshots.map(row));
  $("snapshot-count").textContent = String(snapshots.length);
  $("show-snapshots").hidden = snapshots.length === 0;
  if (snapshots.length === 0 && $("snapshots-dialog").open) $("snapshots-dialog").close();
}

async function showWhole(event) {
  const link = event.target.closest("a[data-version]");
  if (!link || !token()) return;
  event.preventDefault();
  try {
    const whole = await json("GET", `${path}/snapshots/${link.dataset.version}`);
    $("snapshot-shown-title").textContent = `Snapshot v${whole.version}`;
    $("snapshot-json").textContent = JSON.stringify(whole, null, 2);
    $("snapshot-shown").hidden = false;
  } catch (error) {
    showProblem(error);
  }
}

export function wireSnapshots() {
  $("show-snapshots").addEventListener("click", () => $("snapshots-dialog").showModal());
  $("snapshots").addEventListener("click", showWhole);
}

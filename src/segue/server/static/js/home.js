// The list of conversations, a page at a time ("More" follows the Link header's next page),
// and the form that creates one.

import { call, conversationAddress, json } from "./api.js";
import { percentText, shownTokens } from "./meter.js";
import { $, clearProblem, showProblem } from "./ui.js";

const PAGE = 20; // conversations a page of the list holds
let next = null; // the next page's address, from the last page's Link header

// The address of the next page a Link header names (rel="next"), relative to the page's root,
// or null on the last page.
export function nextPage(link) {
  const found = /<([^>]+)>\s*;\s*rel="?next"?/.exec(link || "");
  if (!found) return null;
  const target = new URL(found[1], document.baseURI);
  const root = new URL(document.baseURI).pathname;
  return target.pathname.startsWith(root) ? target.pathname.slice(root.length) + target.search : null;
}

// The create form's body: what the person filled in, and nothing else (the server's own
// settings apply to the rest); throws with words to show when the context edits are not JSON.
function asked() {
  const body = { behavior: $("behavior").value };
  const text = (id) => $(id).value.trim();
  if (text("system")) body.system = text("system");
  const window = Number($("context-window").value);
  if (window) body.context_window = window;
  if (text("summary-prompt")) body.summary_prompt = text("summary-prompt");
  if (text("summary-model")) body.summary_model = text("summary-model");
  if (body.behavior === "compact_in_place") body.compaction = $("compaction").value;
  // Sent only when it is not the server's own (which applies to what the form leaves out).
  const shape = $("summary-request");
  if (shape.value !== shape.dataset.server) body.summary_request = shape.value;
  if (text("new-title")) body.metadata = { title: text("new-title") };
  if (text("context-edits")) {
    try {
      body.context_edits = JSON.parse(text("context-edits"));
    } catch (error) {
      throw new Error(`The context edits are not JSON: ${error.message}`);
    }
  }
  return body;
}

function showCompaction() {
  const choices = $("compaction").options.length;
  $("compaction-choice").hidden = $("behavior").value !== "compact_in_place" || choices < 2;
}

// The provider's compaction is offered only where the server's model adapter can honour it
// (elsewhere creating the conversation would answer 422 unsupported_option: offline, always).
function offerCompaction(info) {
  if (info?.provider_compaction) return;
  $("compaction").querySelector('option[value="provider"]')?.remove();
}

const FOLDED_BELOW = "(max-width: 40rem)"; // a phone: the options start folded

export async function home(info) {
  $("home").hidden = false;
  document.title = "segue: conversations";
  if (info?.context_window) $("context-window").placeholder = `${info.context_window} (this server's)`;
  if (info?.behavior) $("behavior").value = info.behavior;
  offerCompaction(info);
  if (info?.compaction) $("compaction").value = info.compaction;
  if (!$("compaction").value) $("compaction").value = "segue"; // the provider's, not offered
  $("summary-request").value = $("summary-request").dataset.server = info?.summary_request || "tool_less";
  showCompaction();
  $("create-options").open = !matchMedia(FOLDED_BELOW).matches;
  $("behavior").addEventListener("change", showCompaction);
  $("create").addEventListener("submit", async (event) => {
    event.preventDefault();
    clearProblem();
    try {
      const created = await json("POST", "api/conversations", asked());
      location.assign(conversationAddress(created.id));
    } catch (error) {
      showProblem(error);
    }
  });
  $("more").addEventListener("click", more);
  await load(`api/conversations?limit=${PAGE}`, true);
}

// One page of the list, after the ones shown (or in their place: `first`).
async function load(path, first) {
  const response = await call("GET", path);
  const conversations = await response.json();
  next = nextPage(response.headers.get("link"));
  const items = conversations.map(listed);
  if (first) $("conversations").replaceChildren(...items);
  else $("conversations").append(...items);
  $("no-conversations").hidden = !first || conversations.length > 0;
  $("more").hidden = next === null;
}

async function more() {
  if (next === null) return;
  clearProblem();
  $("more").disabled = true;
  try {
    await load(next, false);
  } catch (error) {
    showProblem(error);
  } finally {
    $("more").disabled = false;
  }
}

const WHEN = { dateStyle: "medium", timeStyle: "short" };

// One fact of a conversation's line, kept whole where the line wraps (with the "·" before it).
function fact(text) {
  const span = document.createElement("span");
  span.className = "fact";
  span.textContent = text;
  return span;
}

// One conversation in the list: its title (its own, or the first words of its first
// message), and when, in what phase and how full.
function listed(conversation) {
  const item = document.createElement("li");
  const link = document.createElement("a");
  link.href = conversationAddress(conversation.id);
  link.textContent = conversation.title || "New conversation (no message yet)";
  const meta = document.createElement("span");
  meta.className = "meta";
  const when = conversation.created_at ? new Date(conversation.created_at * 1000).toLocaleString([], WHEN) : "";
  const used = percentText(shownTokens(conversation), conversation.context_window, conversation);
  const phase = conversation.phase.replaceAll("_", " ");
  const facts = [when, phase, `${used}% of the window`].filter(Boolean);
  facts.forEach((text, at) => meta.append(fact(at ? `· ${text}` : text), " "));
  const id = document.createElement("span");
  id.className = "id";
  id.textContent = conversation.id.slice(0, 8);
  const last = fact("· ");
  last.append(id);
  meta.append(last);
  item.append(link, meta);
  return item;
}

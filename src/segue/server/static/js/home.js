// The list of conversations and the form that creates one.

import { conversationAddress, json } from "./api.js";
import { percentText, shownTokens } from "./meter.js";
import { $, clearProblem, showProblem } from "./ui.js";

export async function home(info) {
  $("home").hidden = false;
  document.title = "segue: conversations";
  if (info?.context_window) $("context-window").placeholder = `${info.context_window} (this server's)`;
  if (info?.behavior) $("behavior").value = info.behavior;
  $("create").addEventListener("submit", async (event) => {
    event.preventDefault();
    clearProblem();
    const body = { behavior: $("behavior").value };
    const system = $("system").value.trim();
    if (system) body.system = system;
    const window = Number($("context-window").value);
    if (window) body.context_window = window;
    const summaryPrompt = $("summary-prompt").value.trim();
    if (summaryPrompt) body.summary_prompt = summaryPrompt;
    const summaryModel = $("summary-model").value.trim();
    if (summaryModel) body.summary_model = summaryModel;
    try {
      const created = await json("POST", "api/conversations", body);
      location.assign(conversationAddress(created.id));
    } catch (error) {
      showProblem(error);
    }
  });
  const list = $("conversations");
  const conversations = await json("GET", "api/conversations");
  list.replaceChildren(...conversations.map(listed));
  $("no-conversations").hidden = conversations.length > 0;
}

const WHEN = { dateStyle: "medium", timeStyle: "short" };

// One conversation in the list: its title (the first words of its first message), and when,
// in what phase and how full.
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
  meta.textContent = [when, phase, `${used}% of the window`].filter(Boolean).join(" · ");
  const id = document.createElement("span");
  id.className = "id";
  id.textContent = ` · ${conversation.id.slice(0, 8)}`;
  meta.append(id);
  item.append(link, meta);
  return item;
}

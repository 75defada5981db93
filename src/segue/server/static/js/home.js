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
  list.replaceChildren();
  for (const conversation of await json("GET", "api/conversations")) {
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = conversationAddress(conversation.id);
    link.textContent = conversation.id;
    const meta = document.createElement("span");
    meta.className = "meta";
    const used = percentText(shownTokens(conversation), conversation.context_window, conversation);
    meta.textContent = `${conversation.phase.replaceAll("_", " ")}, ${used}% of the window`;
    item.append(link, meta);
    list.append(item);
  }
}

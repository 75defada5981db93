// The transcript: stored messages, the reply streaming in (its Markdown rendered again at most
// every RENDER_EVERY ms: a long reply is not parsed once per delta), and the notes about tools and sessions. What a model or a user wrote becomes elements
// only through renderMarkdown; everything else goes through textContent.

import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const RENDER_EVERY = 40; // ms; a timer, not animation frames, which stop in a hidden tab

const WHO = {
  user: "You",
  assistant: "Assistant",
  tool_result: "Tool result",
  continuation: "Continuation summary",
  checkpoint: "Checkpoint",
  summary: "Summary of the earlier conversation",
};
const MARKDOWN = new Set(["user", "assistant", "continuation", "checkpoint", "summary"]);

function item(className, who) {
  const li = document.createElement("li");
  li.className = className;
  const label = document.createElement("span");
  label.className = "who";
  label.textContent = who;
  const text = document.createElement("div");
  text.className = "text";
  li.append(label, text);
  return [li, text];
}

// A pinned message says so in words (read out by a screen reader too); its border only shows it.
function markPinned(li) {
  li.classList.add("pinned");
  const badge = document.createElement("span");
  badge.className = "badge";
  badge.textContent = "Pinned: never summarised away";
  li.querySelector(".who").append(" ", badge);
}

export function renderMessage(message) {
  const kind = message.kind;
  const className = kind === "tool_result" ? `tool${message.is_error ? " error" : ""}` : kind;
  const [li, text] = item(className, WHO[kind] || kind);
  li.dataset.session = message.session;
  li.dataset.generation = message.generation;
  if (message.pinned) markPinned(li);
  if (MARKDOWN.has(kind)) renderMarkdown(text, message.text);
  else text.textContent = message.text;
  for (const toolCall of message.tool_calls || []) {
    const used = document.createElement("span");
    used.className = "who";
    used.textContent = `Called ${toolCall.name}(${JSON.stringify(toolCall.input)})`;
    li.append(used);
  }
  $("messages").append(li);
  return li;
}

export function note(text, className = "note") {
  const li = document.createElement("li");
  li.className = className;
  li.textContent = text;
  $("messages").append(li);
  return li;
}

// Replies as they stream: one element per response, its Markdown rendered again as text comes.
export class LiveReplies {
  constructor() {
    this.replies = new Map(); // response number -> { element, text, scheduled }
  }

  clear() {
    this.replies.clear();
  }

  add(response, delta) {
    let reply = this.replies.get(response);
    if (!reply) {
      const [li, element] = item("assistant streaming", WHO.assistant);
      $("messages").append(li);
      reply = { element, text: "", scheduled: false };
      this.replies.set(response, reply);
    }
    reply.text += delta;
    if (!reply.scheduled) {
      reply.scheduled = true;
      setTimeout(() => {
        reply.scheduled = false;
        renderMarkdown(reply.element, reply.text);
      }, RENDER_EVERY);
    }
  }
}

export function clearMessages() {
  $("messages").replaceChildren();
}

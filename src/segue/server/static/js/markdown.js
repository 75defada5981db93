// Markdown as elements, safely: marked parses, raw HTML in the text is shown as text (never
// parsed into elements), images become links (nothing loads from elsewhere), and DOMPurify
// cleans what marked produced before it touches the document (links that run script go).

import { Marked } from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.mjs";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const marked = new Marked({
  gfm: true,
  breaks: true, // a chat's single newlines are line breaks
  renderer: {
    html(token) {
      return escape(token.text); // raw HTML stays text, block or inline
    },
    image(token) {
      return `<a href="${escape(token.href)}">${escape(token.text || token.href)}</a>`;
    },
  },
});

const ALLOWED_TAGS = [
  "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li",
  "ol", "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul", "input",
];
const ALLOWED_ATTR = ["href", "title", "start", "class", "type", "checked", "disabled", "align"];

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
  if (node.tagName === "INPUT" && node.getAttribute("type") !== "checkbox") node.remove();
});

// Fill `element` with `text` rendered as Markdown.
export function renderMarkdown(element, text) {
  const html = marked.parse(String(text ?? ""), { async: false });
  const clean = DOMPurify.sanitize(html, {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ADD_ATTR: ["target"],
    RETURN_DOM_FRAGMENT: true,
  });
  element.replaceChildren(clean);
}

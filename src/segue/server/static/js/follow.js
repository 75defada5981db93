// The messages follow the conversation: on open and as replies stream, the newest is in view,
// unless the reader has scrolled up to read something older; then a "New messages" button
// says more came, and takes them back down.

const NEAR = 40; // px from the bottom that still count as "at the newest"

const $ = (id) => document.getElementById(id);

export const follow = {
  on: true, // the view sticks to the newest message
  height: 0, // the transcript's height when last looked at (what grew since)
  top: 0, // where the view was last put or seen (a move up from it is the reader's)
};

function list() {
  return $("messages");
}

function atNewest() {
  const messages = list();
  return messages.scrollHeight - messages.scrollTop - messages.clientHeight <= NEAR;
}

// Show the newest message, and follow from now on (the reader asked, or the page opened).
export function toNewest() {
  const messages = list();
  follow.on = true;
  messages.scrollTop = messages.scrollHeight;
  follow.height = messages.scrollHeight;
  follow.top = messages.scrollTop;
  $("new-messages").hidden = true;
}

// The transcript changed (a message, a delta, a redraw) or its box did (a banner came).
function settle() {
  const messages = list();
  if (follow.on) {
    messages.scrollTop = messages.scrollHeight;
    follow.top = messages.scrollTop;
  } else if (messages.scrollHeight > follow.height + 1) {
    $("new-messages").hidden = false; // more came below what is being read
  }
  follow.height = messages.scrollHeight;
}

export function followMessages() {
  const messages = list();
  // Only the reader turns following off, by going up: a scroll event also comes when the box
  // shrinks (a banner above it appears) before the view is put back at the newest.
  messages.addEventListener("scroll", () => {
    if (atNewest()) {
      follow.on = true;
      $("new-messages").hidden = true;
    } else if (messages.scrollTop < follow.top - 1) {
      follow.on = false;
    }
    follow.top = messages.scrollTop;
  });
  new MutationObserver(settle).observe(messages, { childList: true, subtree: true, characterData: true });
  new ResizeObserver(settle).observe(messages);
  $("new-messages").addEventListener("click", toNewest);
}

// Bring one message into view (the continuation summary), and stop following to let it be read.
export function show(item) {
  follow.on = false;
  // The list scrolls, never the document (scrollIntoView would scroll the page too when the
  // item is tall and last: a summary holding its "make again" form).
  const box = list();
  box.scrollTop += item.getBoundingClientRect().top - box.getBoundingClientRect().top;
  follow.top = box.scrollTop;
  item.classList.add("shown");
  setTimeout(() => item.classList.remove("shown"), 2000);
}

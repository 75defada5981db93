// segue's page: the conversation list (/) and one conversation (/c/{id}), over the REST API.
// Modules by concern: api (addresses, token, requests, event streams), markdown (safe
// rendering), meter (figures and words about the limit), messages (the transcript), follow
// (keeping the newest message in view), view (one conversation's state drawn), snapshots,
// delete (asking first), stream (updates as they come), conversation (its buttons), home (the
// list a page at a time, the create form).

import { conversationInAddress, json, takeToken } from "./api.js";
import { openConversation } from "./conversation.js";
import { home } from "./home.js";
import { $, showProblem } from "./ui.js";

async function main() {
  takeToken();
  let info = null;
  try {
    info = await json("GET", "api/info");
    $("offline").hidden = !info.offline;
  } catch (error) {
    showProblem(error);
  }
  const id = conversationInAddress();
  try {
    if (id !== null) await openConversation(id);
    else await home(info);
  } catch (error) {
    showProblem(error);
  }
}

main();

// Deleting the conversation: a dialog that names it and asks first (with its continuation
// chain, when it has one, as a choice), then back to the list. A turn that runs is never
// deleted by surprise: the server refuses it (409 busy), and the dialog offers to stop it.

import { ApiError, call, ROOT } from "./api.js";
import { $ } from "./ui.js";
import { view } from "./view.js";

function ask() {
  const title = view.state?.title || "this conversation";
  $("delete-title").textContent = `Delete “${title}”?`;
  const others = view.chainLength - 1;
  $("delete-chain-choice").hidden = others < 1;
  $("delete-chain").checked = false;
  $("delete-chain-text").textContent =
    others === 1
      ? "and the other conversation of its continuation chain"
      : `and the ${others} other conversations of its continuation chain`;
  $("delete-problem").hidden = true;
  $("delete-stop").hidden = true;
  $("delete-confirm").disabled = false;
  $("delete-dialog").showModal();
  $("delete-keep").focus(); // keeping it is the default: Enter does not delete
}

async function remove(stopTheTurn) {
  const query = new URLSearchParams();
  if ($("delete-chain").checked) query.set("chain", "true");
  if (stopTheTurn) query.set("cancel", "true");
  const asked = query.toString();
  $("delete-confirm").disabled = true;
  $("delete-stop").disabled = true;
  try {
    view.navigating = true; // no read of a conversation that is going
    await call("DELETE", `${view.path}${asked ? `?${asked}` : ""}`);
    location.assign(ROOT);
  } catch (error) {
    view.navigating = false;
    const busy = error instanceof ApiError && error.code === "busy";
    $("delete-problem").textContent = busy
      ? "The assistant is answering in this conversation: it was not deleted. Wait for the turn to end, or stop it and delete."
      : `It was not deleted: ${error.message}`;
    $("delete-problem").hidden = false;
    $("delete-stop").hidden = !busy;
    $("delete-stop").disabled = false;
    $("delete-confirm").disabled = busy;
  }
}

export function wireDelete() {
  $("delete").addEventListener("click", ask);
  $("delete-keep").addEventListener("click", () => $("delete-dialog").close());
  $("delete-confirm").addEventListener("click", () => remove(false));
  $("delete-stop").addEventListener("click", () => remove(true));
}

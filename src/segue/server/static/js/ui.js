// What every view of the page shares: element lookup and the problem line in the header.

import { ApiError } from "./api.js";

export const $ = (id) => document.getElementById(id);

// Say what went wrong (an error, or words) in the header's alert line.
export function showProblem(error) {
  const problem = $("problem");
  if (typeof error === "string") problem.textContent = error;
  else problem.textContent = error instanceof ApiError ? error.message : String(error?.message ?? error);
  problem.hidden = false;
}

export function clearProblem() {
  $("problem").hidden = true;
}

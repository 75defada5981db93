// What every view of the page shares: element lookup and the problem line in the header.

import { ApiError } from "./api.js";

export const $ = (id) => document.getElementById(id);

export function showProblem(error) {
  const problem = $("problem");
  problem.textContent = error instanceof ApiError ? error.message : String(error?.message ?? error);
  problem.hidden = false;
}

export function clearProblem() {
  $("problem").hidden = true;
}

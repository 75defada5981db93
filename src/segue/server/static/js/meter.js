// The context meter and the words about it. A figure never rounds across a threshold: it is
// floored (79.7% reads 79%, not an "80%" in the ok style), and where a threshold is not a whole
// percent, a figure past it that a whole number would show below it gets one decimal.

const $ = (id) => document.getElementById(id);

// The figure a meter shows for a conversation's state: measured, else projected.
export function shownTokens(state) {
  return state.context_tokens ?? state.projected_tokens ?? 0;
}

export function levelOf(tokens, state) {
  if (tokens >= state.continuation_tokens) return "critical";
  if (tokens >= state.warning_tokens) return "warning";
  return "ok";
}

function floorTo(value, decimals) {
  const scale = 10 ** decimals;
  return Math.floor(value * scale + 1e-9) / scale;
}

// `tokens` of `window` as the percent a person reads.
export function percentText(tokens, window, state) {
  if (!window) return "0";
  const exact = Math.min(100, (100 * tokens) / window);
  const whole = floorTo(exact, 0);
  const passed = [state?.warning_tokens, state?.continuation_tokens]
    .filter((limit) => limit && tokens >= limit)
    .map((limit) => (100 * limit) / window);
  if (passed.some((threshold) => whole < threshold)) return floorTo(exact, 1).toFixed(1);
  return String(whole);
}

// A threshold as a percent: whole, or with the one decimal it has (80.5).
export function thresholdText(limit, window) {
  const shown = floorTo((100 * limit) / (window || 1), 1);
  return Number.isInteger(shown) ? String(shown) : shown.toFixed(1);
}

export function setMeter(tokens, window, level, state) {
  const meter = $("meter");
  const shown = percentText(tokens, window, state);
  meter.setAttribute("aria-valuenow", shown);
  meter.setAttribute(
    "aria-valuetext",
    `${shown}% (${tokens.toLocaleString("en")} of ${window.toLocaleString("en")} tokens)`,
  );
  meter.querySelector(".fill").style.width = `${Math.min(100, (100 * tokens) / (window || 1))}%`;
  for (const node of [meter, $("meter-label")]) {
    node.classList.remove("level-ok", "level-warning", "level-critical");
    node.classList.add(`level-${level}`);
  }
  $("meter-label").textContent = `${shown}%`;
  $("meter-tokens").textContent = `${tokens.toLocaleString("en")} / ${window.toLocaleString("en")}`;
}

// What happens at the limit, in the conversation's own behaviour; and what the user may do now.
const AT_THE_LIMIT = {
  threshold_based_continuation: {
    then: "this conversation is summarised and continues in a new one",
    action: "Continue in a new conversation",
  },
  compact_in_place: {
    then: "older messages are summarised to make room, and the conversation goes on",
    action: "Compact now",
  },
  checkpoint_restart: {
    then: "the assistant writes a checkpoint and goes on in a fresh session",
    action: "Restart from a checkpoint now",
  },
  checkpoint_pause: {
    then: "the assistant writes a checkpoint and the conversation pauses",
    action: null,
  },
  intentionally_unhandled: {
    then: "this sub-agent stops with a context_exhausted error, for its parent to replace it",
    action: null,
  },
};

export function limitPlan(behavior) {
  return AT_THE_LIMIT[behavior] || { then: "the conversation's behaviour applies", action: null };
}

// The warning banner's words for `tokens` now, or null when there is nothing to warn about:
// short enough for two lines on a phone (the button beside them says what can be done now).
export function warningText(tokens, state) {
  if (tokens < state.warning_tokens) return null;
  const plan = limitPlan(state.behavior);
  const full = percentText(tokens, state.context_window, state);
  const limit = thresholdText(state.continuation_tokens, state.context_window);
  return `Context ${full}% full: at ${limit}% ${plan.then}.`;
}

// Where a conversation's window came from, in the meter's row: said plainly when nobody knew
// it (segue assumed the provider's smallest), quietly when someone reported it.
const WINDOW_SOURCES = {
  given: "window given",
  server: "window from the server",
  table: "window from segue's table",
};
const ASSUMED_WHY =
  "Nobody reported this model's window: segue assumed its provider's smallest. " +
  "Create the conversation with its context window to set it.";

export function windowSource(state) {
  const source = state.context_window_source;
  if (source === "assumed") {
    return { text: `window assumed: ${state.context_window.toLocaleString("en")} tokens`, assumed: true, why: ASSUMED_WHY };
  }
  const text = WINDOW_SOURCES[source];
  return text ? { text, assumed: false, why: `The window, ${state.context_window.toLocaleString("en")} tokens: ${text}.` } : null;
}

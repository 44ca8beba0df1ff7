// What the console says after a change: one status line, the undo of a dismiss or a restore, and the
// audit page's empty, not-found and bad-input states. Loaded before console.js, whose helpers
// (`$`, `el`, `on`, `api`, `showMessage`, `loadMemories`) these functions call when they run.
// Ids stay the strings or numbers the API sent: they are only compared and put into paths.
"use strict";

const NOTICE_MS = 4000;
const UNDO_MS = 6000;
const NOTICE = {
  added: "已新增记忆",
  edited: "已保存修改",
  deleted: "已删除这条记忆",
  DISMISSED: "已忽略这条记忆",
  ACTIVE: "已恢复这条记忆",
  captureOn: "已开启自动收集记忆",
  captureOff: "已关闭自动收集记忆",
  model: (effective) => `已保存记忆抽取模型,当前生效: ${effective}`,
  undone: { ACTIVE: "已撤销忽略,记忆已恢复", DISMISSED: "已撤销恢复,记忆已重新忽略" },
  undoGone: "无法撤销:这条记忆已被删除",
  undoChanged: "无法撤销:这条记忆在此之后又被修改过,列表已刷新",
  undoFailed: (reason) => `撤销未完成:${reason}`,
};
const HISTORY_NOT_FOUND = "找不到这条记忆的变更历史:它不存在,或不属于这个用户";
const BAD_USER_ID = "用户 ID 应为 1 到 9223372036854775807 之间的整数,例如 42";
const BIGINT_MAX = "9223372036854775807";
const feedback = { timer: 0 };

/** Says `text` in the status line for a while; an `action` (the undo) goes with it, and with it leaves. */
function say(text, action) {
  const box = $("toast");
  clearTimeout(feedback.timer);
  box.replaceChildren(el("span", text));
  if (action) box.append(action);
  feedback.timer = setTimeout(() => quiet(box), action ? UNDO_MS : NOTICE_MS);
}

/** Empties the status line; focus inside it (on the undo) moves to the list rather than to nothing. */
function quiet(box = $("toast")) {
  clearTimeout(feedback.timer);
  const hadFocus = box.contains(document.activeElement);
  box.replaceChildren();
  if (hadFocus) focusList();
}

function focusList() {
  const target = $("memory-list").querySelector("button") || $("add-open");
  if (target.offsetParent !== null) target.focus();
}

/** After a dismiss or a restore: the confirmation, with an undo that puts `previous` back. */
function offerUndo(after, previous) {
  const undo = el("button", "撤销", "undo");
  undo.type = "button";
  on(undo, "click", () => runUndo(undo, after, previous));
  say(NOTICE[after.status], undo);
  undo.focus(); // the row and its button just left the list
}

/**
 * The reverse PATCH, once: a second click finds the button spent. The row is read first, and a row
 * deleted or changed since (elsewhere, or in this tab) is left as it is, with the reason said.
 */
async function runUndo(control, after, previous) {
  if (control.spent) return;
  control.spent = true;
  control.disabled = true;
  clearTimeout(feedback.timer); // the line stays while the undo runs
  const generation = state.generation;
  const scratch = el("p"); // the reason goes to the status line, not to the page's error line
  const path = `/api/v1/memory/${after.id}`;
  let text;
  try {
    const now = await api("GET", path, undefined, { box: scratch });
    if (!unchangedSince(after, now)) text = NOTICE.undoChanged;
    else await api("PATCH", path, { status: previous }, { box: scratch });
  } catch (error) {
    if (!(error instanceof ApiFailure)) throw error;
    text = undoFailure(error);
  }
  try {
    await loadMemories();
  } catch (error) {
    if (!(error instanceof ApiFailure)) throw error; // already on the page's error line
  }
  if (generation !== state.generation) return; // signed out meanwhile: nothing of that page stays
  // A later change's line (a later dismiss's own undo among them) replaced this one meanwhile: it
  // stays, and the list shows how this undo ended.
  if (!$("toast").contains(control)) return;
  say(text || NOTICE.undone[previous]);
  if (!text) focusRow(after.id, previous);
}

function unchangedSince(after, now) {
  return now.status === after.status && now.content === after.content && now.updatedAt === after.updatedAt;
}

function undoFailure(error) {
  if (error.code === 40400) return NOTICE.undoGone;
  if (error.code === 0 && error.message === "network") return NOTICE.undoFailed(NETWORK_ERROR);
  return NOTICE.undoFailed(errorText(error.code));
}

/** The undone row's own toggle, when the list shows it; otherwise the list. */
function focusRow(id, status) {
  const row = [...$("memory-list").children].find((li) => li.dataset.id === String(id));
  const toggle = row && row.querySelector(status === "ACTIVE" ? "button.dismiss" : "button.restore");
  if (toggle) toggle.focus();
  else focusList();
}

/** The auto-capture switch, saved; a refused save shows the stored value again. */
async function toggleCapture(box) {
  try {
    const data = await inFlight(box, () => (
      api("PATCH", "/api/v1/memory/settings", { autoCaptureEnabled: box.checked })));
    say(data.autoCaptureEnabled ? NOTICE.captureOn : NOTICE.captureOff);
  } catch (_) {
    await loadSettings();
  } finally {
    showEmpty();
  }
}

/** A history that cannot be found opens the drawer with that said, never with the last one's rows. */
async function openHistory(id, userId) {
  $("history-empty").hidden = true;
  try {
    await showHistory(id, userId);
  } catch (error) {
    if (error.code !== 40400) throw error;
    showMessage($("error"), "");
    $("history-list").replaceChildren();
    showMessage($("history-empty"), HISTORY_NOT_FOUND);
    $("history-drawer").hidden = false;
  }
}

/** The audit's user id as typed, when it is one (a canonical decimal, 1 to 2^63-1); else null, said. */
function readAuditUser() {
  const typed = $("audit-user").value.trim();
  const valid = /^[1-9][0-9]{0,18}$/.test(typed) && (typed.length < 19 || typed <= BIGINT_MAX);
  showMessage($("audit-error"), valid ? "" : BAD_USER_ID);
  if (valid) return typed;
  state.auditUser = null;
  $("audit-table").tBodies[0].replaceChildren();
  $("audit-empty").hidden = true;
  clearPager("audit-");
  $("audit-user").focus();
  return null;
}

/** A user with nothing listed: the server cannot tell an unknown user from one without memories. */
function showAuditEmpty(data) {
  showMessage($("audit-empty"), data.total === 0 ? `用户 ${state.auditUser} 没有记忆:该用户还没有任何记忆,或没有这个用户` : "");
}

/** Nothing said for the previous sign-in stays on screen. */
function resetFeedback() {
  quiet();
  for (const id of ["audit-error", "audit-empty", "history-empty"]) showMessage($(id), "");
}

/**
 * The add dialog's error belongs to what it was said about: typing or another scope clears it, and
 * `closes` counts the dialog's closings so an answer for an earlier opening can tell it is late.
 */
function wireFeedback() {
  const dialog = $("add-dialog");
  dialog.closes = 0;
  dialog.addEventListener("close", () => { dialog.closes += 1; });
  for (const [id, type] of [["add-content", "input"], ["add-scope", "change"]]) {
    $(id).addEventListener(type, () => showMessage($("add-error"), ""));
  }
}

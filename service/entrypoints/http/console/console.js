// The "My memory" page (seed 5.5) and the admin audit page (5.4) over the service's own API.
// Every piece of memory content reaches the DOM through textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const MAX_CHARS = 500;
const TOKEN_KEY = "memoryToken";
const state = {
  view: "memory",
  generation: 0, // bumped when the signed-in token changes, so a slow answer for the old one is dropped
};

class ApiFailure extends Error {
  constructor(code, detail) {
    super(detail);
    this.code = code;
  }
}

// The token lives only in this tab's session storage: pasted, or exchanged for a sign-in link's code.
function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

/** A token's claims, read for display only; the server verifies every call. */
function claims(jwt = token()) {
  try {
    const payload = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const bytes = Uint8Array.from(atob(payload), (c) => c.charCodeAt(0));
    return JSON.parse(new TextDecoder().decode(bytes)) || {};
  } catch (_) {
    return {};
  }
}

function can(permission) {
  const granted = claims().permissions;
  return Array.isArray(granted) && granted.includes(permission);
}

function showMessage(box, text, detail) {
  box.textContent = text || "";
  box.title = detail || "";
  box.hidden = !text;
}

/**
 * One API call. An answer meant for a previous sign-in is dropped; a refused token signs out, which
 * leaves nothing of its user on screen. An `anonymous` call (the sign-in code) sends no token.
 */
async function api(method, path, body, { box = $("error"), anonymous = false } = {}) {
  if (!anonymous && !token()) throw new ApiFailure(40100, "signed out");
  const generation = state.generation;
  const headers = { "Content-Type": "application/json" };
  if (!anonymous) headers.Authorization = `Bearer ${token()}`;
  let response;
  try {
    response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (_) {
    if (generation === state.generation) showMessage(box, NETWORK_ERROR);
    throw new ApiFailure(0, "network");
  }
  const envelope = await response.json().catch(() => ({ code: response.status * 100, message: response.statusText }));
  if (generation !== state.generation) throw new ApiFailure(0, "an answer for a previous sign-in");
  if (!response.ok || envelope.code !== 0) {
    if (envelope.code === 40100 && !anonymous) {
      signOut();
      box = $("error");
    }
    showMessage(box, errorText(envelope.code), envelope.message);
    throw new ApiFailure(envelope.code, envelope.message);
  }
  showMessage(box, "");
  return envelope.data;
}

/** Lets an action run on: an API failure is already on screen when it rejects; anything else is a bug. */
function settle(action) {
  Promise.resolve(action).catch((error) => {
    if (!(error instanceof ApiFailure)) throw error;
  });
}

function on(target, type, handler) {
  target.addEventListener(type, (event) => settle(handler(event)));
}

/** Whether a control applies now; it stays disabled while its request is in flight either way. */
function enable(control, applies) {
  control.invalid = !applies;
  control.disabled = control.invalid || Boolean(control.busy);
}

/** Runs `request` with `control` disabled until it settles, so a double click sends one request. */
async function inFlight(control, request) {
  control.busy = true;
  control.disabled = true;
  try {
    return await request();
  } finally {
    control.busy = false;
    enable(control, !control.invalid);
  }
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function button(text, onClick, className) {
  const b = el("button", text, className);
  b.type = "button";
  on(b, "click", () => onClick(b));
  return b;
}

/** A counter in characters as the server counts them; the save button waits for 1–500. */
function bindCounter(area, counter, save) {
  const update = () => {
    const n = charCount(area.value);
    counter.textContent = `${n}/${MAX_CHARS}`;
    counter.classList.toggle("over", n > MAX_CHARS);
    enable(save, n <= MAX_CHARS && area.value.trim() !== "");
  };
  area.addEventListener("input", update);
  update();
}

/** The page's own confirmation: true for its confirming button, false for 取消 or Esc. */
function ask(title, text, confirmLabel, danger = false) {
  const dialog = $("confirm-dialog");
  if (dialog.open) return Promise.resolve(false);
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = confirmLabel;
  $("confirm-ok").classList.toggle("danger", danger);
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

function setPager(prefix, data) {
  const pages = Math.max(1, Math.ceil(data.total / data.pageSize));
  $(`${prefix}page-info`).textContent = pageText(data.page, pages, data.total);
  enable($(`${prefix}prev`), data.page > 1);
  enable($(`${prefix}next`), data.page < pages);
}

function clearPager(prefix) {
  $(`${prefix}page-info`).textContent = "";
  enable($(`${prefix}prev`), false);
  enable($(`${prefix}next`), false);
}

async function loadSettings() {
  $("auto-capture").checked = (await api("GET", "/api/v1/memory/settings")).autoCaptureEnabled;
}

async function loadMemories() {
  const params = new URLSearchParams({ page: state.page, pageSize: state.pageSize, status: state.status });
  if (state.scope) params.set("scope", state.scope);
  const data = await api("GET", `/api/v1/memory?${params}`);
  // The row being edited keeps its draft while it is still listed.
  const editing = state.editing;
  if (editing && !data.items.some((item) => item.id === editing.item.id)) state.editing = null;
  $("memory-list").replaceChildren(...data.items.map((item) => (
    state.editing && item.id === editing.item.id ? editing.li : memoryRow(item))));
  state.listed = data;
  setPager("", data);
  showEmpty();
}

/** The empty list says where memories come from; with auto-capture off, it points at the switch. */
function showEmpty() {
  const box = $("memory-empty");
  box.hidden = $("memory-list").children.length > 0;
  box.textContent = state.status === "ACTIVE" && !$("auto-capture").checked
    ? "暂无记忆。自动收集已关闭:打开上方的「自动收集记忆」开关后,Mao 会在任务结束后记下值得长期记住的内容;也可以点「新增记忆」手动添加。"
    : "暂无记忆";
}

function memoryRow(item) {
  const li = el("li");
  li.dataset.id = item.id;
  const meta = el("div", undefined, "meta");
  meta.append(el("span", label("source", item.source), `badge ${item.source}`));
  if (item.scope === "PROJECT") meta.append(el("span", `项目: ${item.projectKey}`, "project"));
  if (item.status === "DISMISSED") meta.append(el("span", statusText(item), "dismissed-by"));
  const time = el("time", formatTime(item.updatedAt));
  time.dateTime = item.updatedAt;
  meta.append(time);
  const actions = el("span", undefined, "actions");
  actions.append(
    button("编辑", () => editInline(li, item), "edit"),
    item.status === "ACTIVE"
      ? button("忽略", (b) => setStatus(li, b, "DISMISSED"), "dismiss")
      : button("恢复", (b) => setStatus(li, b, "ACTIVE"), "restore"),
    button("删除", (b) => remove(li, b), "delete danger"),
    button("历史", (b) => inFlight(b, () => openHistory(item.id)), "history"),
  );
  meta.append(actions);
  li.append(el("div", item.content, "content"), meta);
  return li;
}

/** One row at a time is edited: opening another first closes this one, asking if it has changes. */
async function editInline(li, item) {
  if (!(await leaveEdit())) return;
  const area = el("textarea");
  area.value = item.content;
  area.rows = 3;
  const counter = el("span", undefined, "counter");
  const save = button("保存", saveEdit, "save primary");
  const row = el("div", undefined, "edit-actions");
  row.append(counter, button("取消", closeEdit, "cancel"), save);
  li.replaceChildren(area, row);
  state.editing = { li, item, area };
  bindCounter(area, counter, save);
  area.focus();
}

/** The edited row goes back to what it shows unedited; nothing else on the page changes. */
function closeEdit() {
  const { li, item } = state.editing;
  state.editing = null;
  li.replaceWith(memoryRow(item));
}

/** Whether the row being edited may close: at once when unchanged, after asking when not. */
async function leaveEdit() {
  const editing = state.editing;
  if (!editing) return true;
  const changed = editing.area.value !== editing.item.content;
  if (changed && !(await ask("放弃未保存的修改?", "正在编辑的记忆还没有保存,放弃后这些修改将丢失。", "放弃修改"))) {
    editing.area.focus();
    return false;
  }
  if (state.editing === editing) closeEdit();
  return true;
}

async function saveEdit(save) {
  const editing = state.editing;
  await rowRequest(editing.li, save, "PATCH", { content: editing.area.value });
  if (state.editing === editing) state.editing = null;
  say(NOTICE.edited);
  await loadMemories();
}

/** A request about one listed memory; a memory deleted elsewhere (404) leaves the list at once. */
async function rowRequest(li, control, method, body) {
  try {
    return await inFlight(control, () => api(method, `/api/v1/memory/${li.dataset.id}`, body));
  } catch (error) {
    if (error.code === 40400 && li.isConnected) {
      if (state.editing && state.editing.li === li) state.editing = null;
      li.remove();
      state.listed.total -= 1;
      setPager("", state.listed);
      showEmpty();
    }
    throw error;
  }
}

async function setStatus(li, control, status) {
  const after = await rowRequest(li, control, "PATCH", { status });
  offerUndo(after, status === "ACTIVE" ? "DISMISSED" : "ACTIVE");
  await loadMemories();
}

async function remove(li, control) {
  if (!(await ask("删除这条记忆?", "删除后不可恢复。", "删除", true))) return;
  await rowRequest(li, control, "DELETE");
  say(NOTICE.deleted);
  await loadMemories();
}

// Ids (memory, user, session) are the API's decimal strings, kept as text from the answer to the
// screen and back into paths: a JavaScript number is exact only to 2^53. Never Number() or sort by one.
async function showHistory(id, userId) {
  const path = userId
    ? `/api/v1/admin/memory/${encodeURIComponent(id)}/history?${new URLSearchParams({ userId })}`
    : `/api/v1/memory/${encodeURIComponent(id)}/history`;
  const entries = await api("GET", path);
  $("history-list").replaceChildren(...entries.map((h) => {
    const li = el("li");
    const when = h.count > 1
      ? `${formatTime(h.createdAt)} 至 ${formatTime(h.lastAt)} · 共 ${h.count} 次`
      : formatTime(h.createdAt);
    li.append(el("strong", `${label("action", h.action)} · ${label("actor", h.actor)}`), el("div", when, "when"));
    // A memory the user deleted keeps what happened, never its words (docs/api.md).
    if (h.contentErased) li.append(el("div", `内容已由用户删除 · ${formatTime(h.contentErasedAt)}`, "erased"));
    if (h.oldContent) li.append(el("div", `旧: ${h.oldContent}`, "content"));
    if (h.newContent) li.append(el("div", `新: ${h.newContent}`, "content"));
    if (h.originSessionId) li.append(el("div", `会话 ${h.originSessionId}`, "when"));
    return li;
  }));
  $("history-drawer").hidden = false;
}

async function openAdd(control) {
  const projects = await inFlight(control, () => api("GET", "/api/v1/memory/projects"));
  $("add-project").replaceChildren(...projects.map((key) => {
    const option = el("option", key);
    option.value = key;
    return option;
  }));
  $("add-scope").value = "USER";
  $("add-scope").querySelector('[value="PROJECT"]').disabled = projects.length === 0;
  $("add-project-hint").hidden = projects.length > 0;
  $("add-content").value = "";
  $("add-content").dispatchEvent(new Event("input"));
  showScopeFields();
  showMessage($("add-error"), "");
  $("add-dialog").showModal();
  $("add-content").focus();
}

function showScopeFields() {
  $("add-project-label").hidden = $("add-scope").value !== "PROJECT";
}

async function submitAdd(event) {
  event.preventDefault();
  const body = { scope: $("add-scope").value, content: $("add-content").value };
  if (body.scope === "PROJECT") body.projectKey = $("add-project").value;
  const closes = $("add-dialog").closes;
  try {
    await inFlight($("add-submit"), () => api("POST", "/api/v1/memory", body, { box: $("add-error") }));
  } catch (_) {
    // The dialog stays open with the reason shown inside it; one closed meanwhile shows none.
    if ($("add-dialog").closes !== closes) showMessage($("add-error"), "");
    return;
  }
  if ($("add-dialog").closes === closes) $("add-dialog").close();
  say(NOTICE.added);
  await loadMemories();
}

async function loadAudit() {
  if (!state.auditUser) return;
  const params = new URLSearchParams({ userId: state.auditUser, page: state.auditPage, pageSize: 20 });
  const data = await api("GET", `/api/v1/admin/memory?${params}`);
  $("audit-table").tBodies[0].replaceChildren(...data.items.map((item) => {
    const tr = el("tr");
    const cells = [item.id, label("scope", item.scope), item.projectKey || "", item.content,
      label("source", item.source), statusText(item), formatTime(item.updatedAt)];
    tr.append(...cells.map((value) => el("td", String(value))));
    on(tr, "click", () => openHistory(item.id, state.auditUser));
    return tr;
  }));
  setPager("audit-", data);
  showAuditEmpty(data);
}

async function loadModelSetting() {
  const data = await api("GET", "/api/v1/admin/memory/settings");
  $("model-id").value = data.extractionModelId;
  showModelSetting(data);
}

/** The effective model, and while the model rejects events (each one dead-lettered as
 * `model_rejected`) how many since it was set and the last error: a typo must not stay silent. */
function showModelSetting(data) {
  $("model-effective").textContent = `当前生效: ${data.effectiveModel}`;
  const rejected = data.rejections;
  $("model-rejections").hidden = !rejected;
  $("model-rejections").textContent = rejected
    ? `自上次设置以来，模型拒绝了 ${rejected.count} 个事件（已进入死信队列，原因 model_rejected）；`
      + `最近一次 ${formatTime(rejected.lastAt)}（${rejected.lastErrorKind}）: ${rejected.lastError}`
    : "";
}

function showPage(page) {
  const signedIn = token() !== "";
  state.view = page === "audit" && can("memory:read") ? "audit" : "memory";
  for (const name of ["memory", "audit"]) {
    $(`page-${name}`).hidden = !signedIn || name !== state.view;
    $(`nav-${name}`).classList.toggle("active", name === state.view);
  }
  const admin = signedIn && state.view === "audit" && can("memory:admin");
  $("model-setting").hidden = !admin;
  showQuality(signedIn && state.view === "audit");
  return admin ? loadModelSetting() : undefined;
}

/** Who is signed in, with what; the audit tab exists only for `memory:read`. */
function showIdentity() {
  const c = claims();
  const signedIn = token() !== "";
  $("nav").hidden = !signedIn;
  $("whoami").hidden = !signedIn;
  $("token-form").hidden = signedIn;
  $("whoami-user").textContent = signedIn ? `用户 ${c.sub ?? ""}` : "";
  const granted = Array.isArray(c.permissions) ? c.permissions.map((p) => label("permission", p)) : [];
  $("whoami-permissions").textContent = granted.join(" · ");
  $("nav-audit").hidden = !can("memory:read");
  return signedIn;
}

/** (Re)start for the current token: nothing of the previous identity stays on screen. */
function start() {
  state.generation += 1;
  Object.assign(state, {
    scope: "", status: "ACTIVE", page: 1, pageSize: 20, auditPage: 1, auditUser: null, editing: null, listed: null,
  });
  document.querySelectorAll(".scope").forEach((b) => b.classList.toggle("active", b.dataset.scope === ""));
  $("status-filter").value = "ACTIVE";
  $("auto-capture").checked = false;
  $("memory-list").replaceChildren();
  $("memory-empty").hidden = true;
  clearPager("");
  $("audit-user").value = "";
  $("audit-table").tBodies[0].replaceChildren();
  clearPager("audit-");
  $("model-id").value = "";
  $("model-effective").textContent = "";
  $("history-list").replaceChildren();
  $("history-drawer").hidden = true;
  document.querySelectorAll("dialog[open]").forEach((dialog) => dialog.close());
  resetFeedback();
  const signedIn = showIdentity();
  showMessage($("error"), signedIn ? "" : SIGN_IN_PROMPT);
  return signedIn ? Promise.all([showPage(state.view), loadSettings().then(loadMemories)]) : showPage(state.view);
}

function signIn(jwt) {
  sessionStorage.setItem(TOKEN_KEY, jwt);
  return start();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.view = "memory";
  return start();
}

/**
 * A sign-in link (`mao-memory run` prints one): the address forgets its one-time code at once, the
 * code is exchanged for the token, and a link for another account than the signed-in one asks first.
 * An old `#token=` link is never used, and the address forgets its token as well.
 */
async function signInFromLink() {
  const link = new URLSearchParams(location.hash.slice(1));
  if (link.has("code") || link.has("token")) {
    history.replaceState(null, "", location.pathname + location.search);
  }
  const code = link.get("code");
  if (code === null) return;
  let session;
  try {
    session = await api("POST", "/api/v1/console/session", { code: code.trim() }, { anonymous: true });
  } catch (error) {
    if (error.code !== 0) showMessage($("error"), LINK_REFUSED, error.message); // not a network failure
    throw error;
  }
  const [current, next] = [claims().sub, claims(session.token).sub];
  if (token() && current !== next
      && !(await ask("切换账号?", `此链接会以用户 ${next} 登录,替换当前的用户 ${current}。`, "切换"))) return;
  await signIn(session.token);
}

/** Whatever changes the listed page first lets the edited row go (asking if it has changes). */
async function relist(change, control) {
  if (!(await leaveEdit())) {
    $("status-filter").value = state.status;
    return;
  }
  change();
  await inFlight(control, loadMemories);
}

function wire() {
  document.querySelectorAll(".nav").forEach((b) => on(b, "click", () => showPage(b.dataset.page)));
  document.querySelectorAll(".scope").forEach((b) => on(b, "click", () => relist(() => {
    document.querySelectorAll(".scope").forEach((x) => x.classList.toggle("active", x === b));
    state.scope = b.dataset.scope;
    state.page = 1;
  }, b)));
  on($("status-filter"), "change", (e) => relist(() => { state.status = e.target.value; state.page = 1; }, e.target));
  on($("prev"), "click", (e) => relist(() => { state.page -= 1; }, e.currentTarget));
  on($("next"), "click", (e) => relist(() => { state.page += 1; }, e.currentTarget));
  on($("auto-capture"), "change", (e) => toggleCapture(e.target));
  on($("add-open"), "click", (e) => openAdd(e.currentTarget));
  bindCounter($("add-content"), $("add-counter"), $("add-submit"));
  $("add-scope").addEventListener("change", showScopeFields);
  on($("add-form"), "submit", submitAdd);
  $("add-cancel").addEventListener("click", () => $("add-dialog").close());
  // However the dialog closes (取消, Esc, saved), its error leaves with it.
  $("add-dialog").addEventListener("close", () => showMessage($("add-error"), ""));
  wireFeedback();
  $("history-close").addEventListener("click", () => { $("history-drawer").hidden = true; });
  // Esc closes what is on top: a dialog closes itself, then the history drawer, then the edit.
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || document.querySelector("dialog[open]")) return;
    if (!$("history-drawer").hidden) $("history-drawer").hidden = true;
    else if (state.editing) closeEdit();
  });
  on($("audit-form"), "submit", (e) => {
    e.preventDefault();
    const userId = readAuditUser();
    if (userId === null) return undefined;
    state.auditUser = userId;
    state.auditPage = 1;
    return inFlight(e.submitter, loadAudit);
  });
  on($("audit-prev"), "click", (e) => { state.auditPage -= 1; return inFlight(e.currentTarget, loadAudit); });
  on($("audit-next"), "click", (e) => { state.auditPage += 1; return inFlight(e.currentTarget, loadAudit); });
  on($("model-form"), "submit", async (e) => {
    e.preventDefault();
    const body = { extractionModelId: $("model-id").value.trim(), probe: $("model-probe").checked };
    const box = $("model-error");
    try {
      const data = await inFlight(e.submitter, () => api("PUT", "/api/v1/admin/memory/settings", body, { box }));
      showModelSetting(data);
      say(NOTICE.model(data.effectiveModel));
    } catch (error) {
      // The server says what is wrong with the model (no provider, a failed test call): shown whole.
      if (error instanceof ApiFailure && error.code === 40000) showMessage(box, `未保存: ${error.message}`, error.message);
      throw error;
    }
  });
  on($("token-form"), "submit", (e) => {
    e.preventDefault();
    const pasted = $("token").value.trim();
    $("token").value = "";
    return pasted ? signIn(pasted) : undefined;
  });
  on($("sign-out"), "click", signOut);
  on(window, "hashchange", signInFromLink);
}

wire();
settle(Promise.all([start(), signInFromLink()]));

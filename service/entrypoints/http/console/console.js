// The "My memory" page (seed 5.5) and the admin audit page (5.4) over the service's own API.
// Every piece of memory content reaches the DOM through textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const MAX_CHARS = 500;
const state = {
  scope: "", status: "ACTIVE", page: 1, pageSize: 20, auditPage: 1, auditUser: null, view: "memory",
  generation: 0, // bumped when the signed-in token changes, so a slow answer for the old one is dropped
};

class ApiFailure extends Error {
  constructor(code, detail) {
    super(detail);
    this.code = code;
  }
}

// The token lives only in this tab's session. A #token= in the address (on load or later, in an
// open tab) replaces it and is removed from the address at once.
function adoptTokenFromAddress() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash === null) return false;
  sessionStorage.setItem("memoryToken", fromHash.trim());
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}

function token() {
  return sessionStorage.getItem("memoryToken") || "";
}

/** The token's claims, read for display only; the server verifies every call. */
function claims() {
  try {
    const payload = token().split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
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

async function api(method, path, body, errorBox = $("error")) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: { Authorization: `Bearer ${token()}`, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (_) {
    showMessage(errorBox, NETWORK_ERROR);
    throw new ApiFailure(0, "network");
  }
  const envelope = await response.json().catch(() => ({ code: response.status * 100, message: response.statusText }));
  if (!response.ok || envelope.code !== 0) {
    showMessage(errorBox, errorText(envelope.code), envelope.message);
    throw new ApiFailure(envelope.code, envelope.message);
  }
  showMessage(errorBox, "");
  return envelope.data;
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
  b.addEventListener("click", onClick);
  return b;
}

/** A counter in characters as the server counts them; the save button waits for 1–500. */
function bindCounter(area, counter, save) {
  const update = () => {
    const n = charCount(area.value);
    counter.textContent = `${n}/${MAX_CHARS}`;
    counter.classList.toggle("over", n > MAX_CHARS);
    save.disabled = n > MAX_CHARS || area.value.trim() === "";
  };
  area.addEventListener("input", update);
  update();
}

function setPager(prefix, data) {
  const pages = Math.max(1, Math.ceil(data.total / data.pageSize));
  $(`${prefix}page-info`).textContent = pageText(data.page, pages, data.total);
  $(`${prefix}prev`).disabled = data.page <= 1;
  $(`${prefix}next`).disabled = data.page >= pages;
}

async function loadSettings() {
  const generation = state.generation;
  const data = await api("GET", "/api/v1/memory/settings");
  if (generation === state.generation) $("auto-capture").checked = data.autoCaptureEnabled;
}

async function loadMemories() {
  const generation = state.generation;
  const params = new URLSearchParams({ page: state.page, pageSize: state.pageSize, status: state.status });
  if (state.scope) params.set("scope", state.scope);
  const data = await api("GET", `/api/v1/memory?${params}`);
  if (generation !== state.generation) return;
  $("memory-list").replaceChildren(...data.items.map(memoryRow));
  $("memory-empty").hidden = data.items.length > 0;
  setPager("", data);
}

function memoryRow(item) {
  const li = el("li");
  li.dataset.id = item.id;
  const meta = el("div", undefined, "meta");
  meta.append(el("span", label("source", item.source), `badge ${item.source}`));
  if (item.scope === "PROJECT") meta.append(el("span", `项目: ${item.projectKey}`, "project"));
  if (item.dismissedBy === "CAPACITY") meta.append(el("span", "容量已满时自动收起", "capacity"));
  const time = el("time", formatTime(item.updatedAt));
  time.dateTime = item.updatedAt;
  meta.append(time);
  const actions = el("span", undefined, "actions");
  actions.append(
    button("编辑", () => editInline(li, item), "edit"),
    item.status === "ACTIVE"
      ? button("忽略", () => setStatus(item, "DISMISSED"), "dismiss")
      : button("恢复", () => setStatus(item, "ACTIVE"), "restore"),
    button("删除", () => remove(item), "delete danger"),
    button("历史", () => showHistory(item.id), "history"),
  );
  meta.append(actions);
  li.append(el("div", item.content, "content"), meta);
  return li;
}

function editInline(li, item) {
  const area = el("textarea");
  area.value = item.content;
  area.rows = 3;
  const counter = el("span", undefined, "counter");
  const save = button("保存", () => {
    api("PATCH", `/api/v1/memory/${item.id}`, { content: area.value }).then(loadMemories).catch(() => {});
  }, "save primary");
  const row = el("div", undefined, "edit-actions");
  row.append(counter, button("取消", () => loadMemories().catch(() => {}), "cancel"), save);
  li.replaceChildren(area, row);
  bindCounter(area, counter, save);
  area.focus();
}

async function setStatus(item, status) {
  await api("PATCH", `/api/v1/memory/${item.id}`, { status });
  await loadMemories();
}

async function remove(item) {
  if (!confirm("确定删除这条记忆吗?删除后不可恢复。")) return;
  await api("DELETE", `/api/v1/memory/${item.id}`);
  await loadMemories();
}

async function showHistory(id, userId) {
  const path = userId ? `/api/v1/admin/memory/${id}/history?userId=${userId}` : `/api/v1/memory/${id}/history`;
  const entries = await api("GET", path);
  $("history-list").replaceChildren(...entries.map((h) => {
    const li = el("li");
    const when = h.count > 1
      ? `${formatTime(h.createdAt)} 至 ${formatTime(h.lastAt)} · 共 ${h.count} 次`
      : formatTime(h.createdAt);
    li.append(el("strong", `${label("action", h.action)} · ${label("actor", h.actor)}`), el("div", when, "when"));
    if (h.oldContent) li.append(el("div", `旧: ${h.oldContent}`, "content"));
    if (h.newContent) li.append(el("div", `新: ${h.newContent}`, "content"));
    if (h.originSessionId) li.append(el("div", `会话 ${h.originSessionId}`, "when"));
    return li;
  }));
  $("history-drawer").hidden = false;
}

async function openAdd() {
  const projects = await api("GET", "/api/v1/memory/projects");
  $("add-project").replaceChildren(...projects.map((key) => {
    const option = el("option", key);
    option.value = key;
    return option;
  }));
  $("add-scope").value = "USER";
  $("add-scope").querySelector('[value="PROJECT"]').disabled = projects.length === 0;
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
  try {
    await api("POST", "/api/v1/memory", body, $("add-error"));
  } catch (_) {
    return; // the dialog stays open with the reason shown inside it
  }
  $("add-dialog").close();
  await loadMemories();
}

async function loadAudit() {
  if (!state.auditUser) return;
  const generation = state.generation;
  const params = new URLSearchParams({ userId: state.auditUser, page: state.auditPage, pageSize: 20 });
  const data = await api("GET", `/api/v1/admin/memory?${params}`);
  if (generation !== state.generation) return;
  $("audit-table").tBodies[0].replaceChildren(...data.items.map((item) => {
    const tr = el("tr");
    const status = item.dismissedBy === "CAPACITY" ? "容量已满时收起" : label("status", item.status);
    const cells = [item.id, label("scope", item.scope), item.projectKey || "", item.content,
      label("source", item.source), status, formatTime(item.updatedAt)];
    tr.append(...cells.map((value) => el("td", String(value))));
    tr.addEventListener("click", () => showHistory(item.id, state.auditUser).catch(() => {}));
    return tr;
  }));
  setPager("audit-", data);
}

async function loadModelSetting() {
  const generation = state.generation;
  const data = await api("GET", "/api/v1/admin/memory/settings");
  if (generation !== state.generation) return;
  $("model-id").value = data.extractionModelId;
  $("model-effective").textContent = `当前生效: ${data.effectiveModel}`;
}

function showPage(page) {
  state.view = page === "audit" && can("memory:read") ? "audit" : "memory";
  for (const name of ["memory", "audit"]) {
    $(`page-${name}`).hidden = name !== state.view;
    $(`nav-${name}`).classList.toggle("active", name === state.view);
  }
  const admin = state.view === "audit" && can("memory:admin");
  $("model-setting").hidden = !admin;
  if (admin) loadModelSetting().catch(() => {});
}

/** Who is signed in, with what; the audit tab exists only for `memory:read`. */
function showIdentity() {
  const c = claims();
  const signedIn = token() !== "" && c.sub !== undefined;
  $("whoami").hidden = !signedIn;
  $("whoami-user").textContent = signedIn ? `用户 ${c.sub}` : "";
  const granted = Array.isArray(c.permissions) ? c.permissions.map((p) => label("permission", p)) : [];
  $("whoami-permissions").textContent = granted.join(" · ");
  $("nav-audit").hidden = !can("memory:read");
}

/** (Re)start for the current token: nothing of the previous identity stays on screen. */
function start() {
  state.generation += 1;
  state.auditUser = null;
  state.page = 1;
  $("audit-table").tBodies[0].replaceChildren();
  $("audit-page-info").textContent = "";
  $("memory-list").replaceChildren();
  $("history-drawer").hidden = true;
  if ($("add-dialog").open) $("add-dialog").close();
  showIdentity();
  showPage(state.view);
  if (!token()) {
    showMessage($("error"), "请先输入平台签发的令牌 (JWT)");
    return;
  }
  showMessage($("error"), "");
  loadSettings().then(loadMemories).catch(() => {});
}

function wire() {
  document.querySelectorAll(".nav").forEach((b) => b.addEventListener("click", () => showPage(b.dataset.page)));
  document.querySelectorAll(".scope").forEach((b) => b.addEventListener("click", () => {
    document.querySelectorAll(".scope").forEach((x) => x.classList.toggle("active", x === b));
    state.scope = b.dataset.scope;
    state.page = 1;
    loadMemories().catch(() => {});
  }));
  $("status-filter").addEventListener("change", (e) => { state.status = e.target.value; state.page = 1; loadMemories().catch(() => {}); });
  $("prev").addEventListener("click", () => { state.page -= 1; loadMemories().catch(() => {}); });
  $("next").addEventListener("click", () => { state.page += 1; loadMemories().catch(() => {}); });
  $("auto-capture").addEventListener("change", (e) => {
    api("PATCH", "/api/v1/memory/settings", { autoCaptureEnabled: e.target.checked }).catch(() => loadSettings().catch(() => {}));
  });
  $("add-open").addEventListener("click", () => openAdd().catch(() => {}));
  bindCounter($("add-content"), $("add-counter"), $("add-submit"));
  $("add-scope").addEventListener("change", showScopeFields);
  $("add-form").addEventListener("submit", (e) => { submitAdd(e).catch(() => {}); });
  $("add-cancel").addEventListener("click", () => $("add-dialog").close());
  // However the dialog closes (取消, Esc, saved), its error leaves with it.
  $("add-dialog").addEventListener("close", () => showMessage($("add-error"), ""));
  $("history-close").addEventListener("click", () => { $("history-drawer").hidden = true; });
  $("audit-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.auditUser = $("audit-user").value;
    state.auditPage = 1;
    loadAudit().catch(() => {});
  });
  $("audit-prev").addEventListener("click", () => { state.auditPage -= 1; loadAudit().catch(() => {}); });
  $("audit-next").addEventListener("click", () => { state.auditPage += 1; loadAudit().catch(() => {}); });
  $("model-form").addEventListener("submit", (e) => {
    e.preventDefault();
    api("PUT", "/api/v1/admin/memory/settings", { extractionModelId: $("model-id").value.trim() })
      .then((data) => { $("model-effective").textContent = `当前生效: ${data.effectiveModel}`; })
      .catch(() => {});
  });
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("memoryToken", $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem("memoryToken");
    start();
  });
  window.addEventListener("hashchange", () => { if (adoptTokenFromAddress()) start(); });
}

adoptTokenFromAddress();
wire();
start();

// The "My memory" page (seed 5.5) and the admin audit page (5.4) over the service's own API.
// Every piece of memory content reaches the DOM through textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const SOURCE_LABEL = { AUTO: "自动", MANUAL: "手动", CONSOLIDATED: "合并" };
const state = { scope: "", status: "ACTIVE", page: 1, pageSize: 20, auditPage: 1, auditUser: null };

// The token lives only in this tab's session; a #token= in the URL is taken once and removed.
function readToken() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) {
    sessionStorage.setItem("memoryToken", fromHash);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("memoryToken") || "";
}

function permissions() {
  try {
    const payload = readToken().split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload)).permissions || [];
  } catch (_) {
    return [];
  }
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${readToken()}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const envelope = await response.json().catch(() => ({ code: response.status, message: response.statusText }));
  if (!response.ok || envelope.code !== 0) {
    showError(envelope.message || `HTTP ${response.status}`);
    throw new Error(envelope.message);
  }
  showError("");
  return envelope.data;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function button(label, onClick, className) {
  const b = el("button", label, className);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

async function loadSettings() {
  const data = await api("GET", "/api/v1/memory/settings");
  $("auto-capture").checked = data.autoCaptureEnabled;
}

async function loadMemories() {
  const params = new URLSearchParams({ page: state.page, pageSize: state.pageSize, status: state.status });
  if (state.scope) params.set("scope", state.scope);
  const data = await api("GET", `/api/v1/memory?${params}`);
  const list = $("memory-list");
  list.replaceChildren(...data.items.map(memoryRow));
  const pages = Math.max(1, Math.ceil(data.total / data.pageSize));
  $("page-info").textContent = `${data.page} / ${pages} · ${data.total}`;
  $("prev").disabled = data.page <= 1;
  $("next").disabled = data.page >= pages;
}

function memoryRow(item) {
  const li = el("li");
  li.dataset.id = item.id;
  const content = el("div", item.content, "content");
  const meta = el("div", undefined, "meta");
  meta.append(el("span", SOURCE_LABEL[item.source] || item.source, `badge ${item.source}`));
  if (item.scope === "PROJECT") meta.append(el("span", `项目: ${item.projectKey}`, "project"));
  if (item.dismissedBy === "CAPACITY") meta.append(el("span", "容量已满时自动收起", "capacity"));
  meta.append(el("time", new Date(item.updatedAt).toLocaleString()));
  const actions = el("span", undefined, "actions");
  actions.append(
    button("编辑", () => editInline(li, item), "edit"),
    item.status === "ACTIVE"
      ? button("忽略", () => setStatus(item, "DISMISSED"), "dismiss")
      : button("恢复", () => setStatus(item, "ACTIVE"), "restore"),
    button("删除", () => remove(item), "delete"),
    button("历史", () => showHistory(item.id), "history"),
  );
  meta.append(actions);
  li.append(content, meta);
  return li;
}

function editInline(li, item) {
  const area = el("textarea");
  area.value = item.content;
  area.maxLength = 500;
  const save = button("保存", async () => {
    await api("PATCH", `/api/v1/memory/${item.id}`, { content: area.value });
    await loadMemories();
  }, "save");
  li.replaceChildren(area, save, button("取消", loadMemories, "cancel"));
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
      ? `${new Date(h.createdAt).toLocaleString()} – ${new Date(h.lastAt).toLocaleString()} · ${h.count} 次`
      : new Date(h.createdAt).toLocaleString();
    li.append(el("strong", `${h.action} · ${h.actor}`), el("div", when));
    if (h.oldContent) li.append(el("div", `旧: ${h.oldContent}`, "content"));
    if (h.newContent) li.append(el("div", `新: ${h.newContent}`, "content"));
    if (h.originSessionId) li.append(el("div", `会话 ${h.originSessionId}`));
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
  $("add-content").value = "";
  updateCounter();
  $("add-dialog").showModal();
}

function updateCounter() {
  $("add-counter").textContent = `${[...$("add-content").value].length}/500`;
  $("add-project-label").hidden = $("add-scope").value !== "PROJECT";
}

async function submitAdd(event) {
  event.preventDefault();
  const body = { scope: $("add-scope").value, content: $("add-content").value };
  if (body.scope === "PROJECT") body.projectKey = $("add-project").value;
  try {
    await api("POST", "/api/v1/memory", body);
    $("add-dialog").close();
    await loadMemories();
  } catch (_) { /* the envelope's message is shown */ }
}

async function loadAudit() {
  if (!state.auditUser) return;
  const params = new URLSearchParams({ userId: state.auditUser, page: state.auditPage, pageSize: 20 });
  const data = await api("GET", `/api/v1/admin/memory?${params}`);
  $("audit-table").tBodies[0].replaceChildren(...data.items.map((item) => {
    const tr = el("tr");
    const cells = [item.id, item.scope, item.projectKey || "", item.content, SOURCE_LABEL[item.source], item.status,
      new Date(item.updatedAt).toLocaleString()];
    tr.append(...cells.map((value) => el("td", String(value))));
    tr.addEventListener("click", () => showHistory(item.id, state.auditUser));
    return tr;
  }));
  const pages = Math.max(1, Math.ceil(data.total / data.pageSize));
  $("audit-page-info").textContent = `${data.page} / ${pages} · ${data.total}`;
  $("audit-prev").disabled = data.page <= 1;
  $("audit-next").disabled = data.page >= pages;
}

async function loadModelSetting() {
  const isAdmin = permissions().includes("memory:admin");
  $("model-setting").hidden = !isAdmin;
  if (!isAdmin) return;
  const data = await api("GET", "/api/v1/admin/memory/settings");
  $("model-id").value = data.extractionModelId;
  $("model-effective").textContent = `生效: ${data.effectiveModel}`;
}

function showPage(page) {
  for (const name of ["memory", "audit"]) {
    $(`page-${name}`).hidden = name !== page;
    $(`nav-${name}`).classList.toggle("active", name === page);
  }
  if (page === "audit") loadModelSetting().catch(() => {});
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
    api("PATCH", "/api/v1/memory/settings", { autoCaptureEnabled: e.target.checked }).catch(loadSettings);
  });
  $("add-open").addEventListener("click", () => openAdd().catch(() => {}));
  $("add-content").addEventListener("input", updateCounter);
  $("add-scope").addEventListener("change", updateCounter);
  $("add-form").addEventListener("submit", submitAdd);
  $("add-form").querySelector('[value="cancel"]').addEventListener("click", () => $("add-dialog").close());
  $("history-close").addEventListener("click", () => { $("history-drawer").hidden = true; });
  $("audit-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.auditUser = $("audit-user").value;
    state.auditPage = 1;
    loadAudit().catch(() => {});
  });
  $("audit-prev").addEventListener("click", () => { state.auditPage -= 1; loadAudit().catch(() => {}); });
  $("audit-next").addEventListener("click", () => { state.auditPage += 1; loadAudit().catch(() => {}); });
  $("model-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const data = await api("PUT", "/api/v1/admin/memory/settings", { extractionModelId: $("model-id").value.trim() });
    $("model-effective").textContent = `生效: ${data.effectiveModel}`;
  });
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("memoryToken", $("token").value.trim());
    $("token").value = "";
    start();
  });
}

function start() {
  if (!readToken()) {
    showError("请先输入平台签发的 JWT");
    return;
  }
  loadSettings().then(loadMemories).catch(() => {});
}

wire();
start();

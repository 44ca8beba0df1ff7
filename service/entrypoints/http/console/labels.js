// Everything the console shows a user in words: errors by the envelope's code, enum values, times.
// The API speaks English and codes (docs/api.md); the user reads Chinese from these tables only.
"use strict";

const ERROR_TEXT = {
  40000: "提交的内容不符合要求,请检查后重试",
  40100: "令牌无效或已过期,请重新输入平台签发的令牌",
  40300: "当前账号没有此操作的权限",
  40400: "记忆不存在或已被删除",
  40500: "不支持的操作",
  40900: "已有一条相同内容的记忆",
  40901: "生效中的记忆已达 200 条上限,请先忽略或删除一些",
  41300: "提交的内容过大",
  50000: "服务内部错误,请稍后重试",
  50300: "服务暂时不可用,请稍后重试",
};
const NETWORK_ERROR = "无法连接到服务,请检查网络后重试";
const UNKNOWN_ERROR = "操作失败,请稍后重试";
const SIGN_IN_PROMPT = "请先输入平台签发的令牌 (JWT)";
const LINK_REFUSED = "登录链接已失效:每个链接只能登录一次,且 10 分钟内有效。请粘贴令牌登录";

const LABELS = {
  scope: { USER: "用户", PROJECT: "项目" },
  status: { ACTIVE: "生效中", DISMISSED: "已忽略" },
  dismissedBy: { USER: "用户忽略", CAPACITY: "容量降级" },
  source: { AUTO: "自动", MANUAL: "手动", CONSOLIDATED: "合并" },
  action: {
    insert: "自动新增", touch: "再次确认", update: "自动更新", merge: "合并", drop: "合并时删除",
    demote: "容量已满时收起", restore: "恢复", create: "手动新增", edit: "编辑", dismiss: "忽略",
    delete: "删除",
  },
  actor: { auto: "自动收集", user: "用户", consolidator: "定期整理", migration: "数据迁移" },
  permission: { "memory:read": "审计", "memory:admin": "管理" },
};

/** The Chinese text for an API error; the English detail stays available as a tooltip. */
function errorText(code) {
  return ERROR_TEXT[code] || UNKNOWN_ERROR;
}

/** An enum value in Chinese; an unknown value (a newer server) is shown as it came. */
function label(kind, value) {
  return (LABELS[kind] && LABELS[kind][value]) || value;
}

/** A memory's status; a dismissed one says who set it aside (the user, or room for newer facts). */
function statusText(item) {
  return item.status === "DISMISSED" && item.dismissedBy ? label("dismissedBy", item.dismissedBy) : label("status", item.status);
}

/** `YYYY-MM-DD HH:mm` in the browser's time zone, whatever its locale. */
function formatTime(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  const two = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}`;
}

/** Pager text: the page out of how many, and the number of items. */
function pageText(page, pages, total) {
  return `第 ${page} / ${pages} 页 · 共 ${total} 条`;
}

/** Characters as the server counts them (code points), not UTF-16 units. */
function charCount(text) {
  return [...text].length;
}

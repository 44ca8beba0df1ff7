// The admin page's "extraction quality" table: per extraction model, how many of its memories of the
// last 90 days users rejected within 7 and 30 days, and how many later extractions re-confirmed
// (GET /api/v1/admin/memory/quality). Loaded before console.js, whose helpers (`$`, `el`, `api`,
// `can`, `settle`) it calls when it runs; console.js calls `showQuality` when the admin page opens.
"use strict";

const QUALITY_NO_MODELS = "最近 90 天还没有自动抽取的记忆";
const QUALITY_TOO_YOUNG = "—";

function percent(rate) {
  return rate === null ? QUALITY_TOO_YOUNG : `${(rate * 100).toFixed(1)}%`;
}

/** "12.5%（忽略 3 · 删除 1 · 编辑 1 / 40）", or "—" while no memory of the model is that old. */
function rejectedCell(horizon) {
  if (horizon.cohort === 0) return el("td", QUALITY_TOO_YOUNG);
  const r = horizon.rejected;
  const detail = `（忽略 ${r.dismissed} · 删除 ${r.deleted} · 编辑 ${r.edited} / ${horizon.cohort}）`;
  const cell = el("td", percent(horizon.rejectedRate));
  cell.append(el("span", detail, "quality-detail"));
  return cell;
}

function qualityRow(model) {
  const tr = document.createElement("tr");
  tr.append(el("td", model.model), el("td", String(model.created)));
  for (const horizon of model.within) tr.append(rejectedCell(horizon));
  tr.append(el("td", `${percent(model.reconfirmedRate)}（${model.reconfirmed}）`));
  return tr;
}

async function loadQuality() {
  const data = await api("GET", "/api/v1/admin/memory/quality", undefined, { box: $("quality-error") });
  $("quality-table").tBodies[0].replaceChildren(...data.models.map(qualityRow));
  $("quality-empty").textContent = QUALITY_NO_MODELS;
  $("quality-empty").hidden = data.models.length > 0;
}

/** Shown with the admin page to every `memory:read` holder: the figures name models, never users. */
function showQuality(shown) {
  const visible = shown && can("memory:read");
  $("model-quality").hidden = !visible;
  if (!visible) {
    $("quality-table").tBodies[0].replaceChildren();
    return;
  }
  settle(loadQuality());
}

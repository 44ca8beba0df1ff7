"""`dlq replay` replays each dead letter once, against a real Tansu: its own consumer group remembers
how far it read, a dry run commits nothing, and a commit the broker fails repeats at most one letter."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from service.adapters.kafka.replay import (
    Replay,
    ReplayReport,
    ReplayStopped,
    Selection,
    replay_dead_letters,
    replay_group,
)
from service.adapters.kafka.topics import ensure_topics
from service.entrypoints.progress import Progress
from tests.conftest import eventually
from tests.contract.test_cli import cli
from tests.integration.test_dlq_replay import read_all
from tests.support.backends import Broker


async def dead_letters(bootstrap: str, dlq: str, reasons: list[str]) -> None:
    """One letter per reason, its value naming its index, as the consumer would have written it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for i, reason in enumerate(reasons):
            await producer.send(
                dlq,
                json.dumps({"n": i}).encode(),
                key=str(i).encode(),
                headers=[("x-dlq-reason", reason.encode())],
            )
        await producer.flush()
    finally:
        await producer.stop()


async def replayed_ns(bootstrap: str, topic: str) -> Counter[int]:
    return Counter(json.loads(r.value or b"")["n"] for r in await read_all(bootstrap, topic))


def cli_env(replay: Replay) -> dict[str, str]:
    """The command's settings for this replay, and this checkout's code (`cli` runs elsewhere)."""
    return {
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "MEMORY_KAFKA_BOOTSTRAP": replay.bootstrap,
        "MEMORY_KAFKA_TOPIC": replay.topic,
        "MEMORY_KAFKA_GROUP_ID": replay.group.removesuffix(".dlq-replay"),
        "MEMORY_KAFKA_DLQ_IDEMPOTENCE": "false",  # Tansu has no idempotent producers
    }


@pytest.fixture
async def replay(broker: Broker) -> Replay:
    """An empty main topic and its DLQ; the replay of the whole DLQ through a group of its own."""
    topic = f"task.finished.{uuid.uuid4().hex[:8]}"
    await ensure_topics(broker.bootstrap, [topic, f"{topic}.dlq"], partitions=1)
    return Replay(broker.bootstrap, f"{topic}.dlq", topic, replay_group(f"g-{uuid.uuid4().hex[:8]}", None))


async def test_a_second_run_replays_nothing_and_from_beginning_replays_again(replay: Replay) -> None:
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["model_rejected"] * 20)

    first = await replay_dead_letters(replay)
    second = await replay_dead_letters(replay)
    assert (first.read, first.replayed) == (20, 20) and (second.read, second.replayed) == (0, 0)
    assert await replayed_ns(replay.bootstrap, replay.topic) == Counter(range(20))

    await dead_letters(replay.bootstrap, replay.dlq_topic, ["schema"] * 3)  # new letters arrive
    third = await replay_dead_letters(replay)
    assert (third.read, third.replayed) == (3, 3)
    again = await replay_dead_letters(dataclasses.replace(replay, from_beginning=True))
    assert (again.read, again.replayed) == (23, 23)
    assert (await replay_dead_letters(replay)).replayed == 0  # --from-beginning moved the group too


async def test_a_dry_run_says_would_replay_and_commits_nothing(replay: Replay) -> None:
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["model_rejected"] * 5 + ["schema"] * 2)

    dry = await replay_dead_letters(dataclasses.replace(replay, dry_run=True))
    assert dry.as_dict() == {
        "group": replay.group,
        "dryRun": True,
        "read": 7,
        "wouldReplay": 7,
        "skipped": {},
        "byReason": {"model_rejected": 5, "schema": 2},
    }
    assert await read_all(replay.bootstrap, replay.topic) == []
    real = await replay_dead_letters(replay)
    assert real.as_dict()["replayed"] == 7 and "wouldReplay" not in real.as_dict()


async def test_a_reason_run_skips_the_others_in_its_own_group(replay: Replay) -> None:
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["schema", "model_rejected", "schema"])
    only = dataclasses.replace(
        replay, group=replay_group(replay.group, "model_rejected"), selection=Selection("model_rejected")
    )

    report = await replay_dead_letters(only)
    assert (report.read, report.replayed, dict(report.skipped)) == (3, 1, {"other_reason": 2})
    assert (await replay_dead_letters(only)).read == 0
    # The run of every reason has its own position: the schema letters are still ahead of it.
    assert await replayed_ns(replay.bootstrap, replay.topic) == Counter([1])
    assert (await replay_dead_letters(replay)).replayed == 3


async def test_a_commit_the_broker_fails_repeats_that_letter_only(replay: Replay) -> None:
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["model_rejected"] * 10)
    # A live member in the replay's group: the broker refuses the replay's commits (UnknownMemberId).
    member = AIOKafkaConsumer(
        replay.dlq_topic,
        bootstrap_servers=replay.bootstrap,
        group_id=replay.group,
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    await member.start()
    try:
        await member.getmany(timeout_ms=2000)
        with pytest.raises(ReplayStopped) as stopped:
            await replay_dead_letters(replay)
        stopped_run = await asyncio.to_thread(cli, "dlq", "replay", "--quiet", **cli_env(replay))
    finally:
        await member.stop()
    assert stopped.value.report.replayed == 1  # republished and acknowledged, its commit refused

    # The command says so in one line, with the summary so far, and exits non-zero.
    assert stopped_run.returncode == 1 and json.loads(stopped_run.stdout)["replayed"] == 1
    [said] = [line for line in stopped_run.stderr.splitlines() if not line.startswith("OffsetCommit failed")]
    assert said.startswith("mao-memory: dlq replay stopped (CommitFailedError: ") and "run it again" in said
    assert await replayed_ns(replay.bootstrap, replay.topic) == Counter([0, 0])

    # Tansu keeps the stopped member in the group, so the group's position is read, not resumed: no
    # commit, so the next run starts again at the letter already republished.
    probe = AIOKafkaConsumer(bootstrap_servers=replay.bootstrap, group_id=replay.group)
    await probe.start()
    try:
        assert await probe.committed(TopicPartition(replay.dlq_topic, 0)) is None
    finally:
        await probe.stop()


async def test_a_replay_killed_midway_loses_no_letter_and_repeats_at_most_one(replay: Replay) -> None:
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["model_rejected"] * 3000)
    env = cli_env(replay)
    with subprocess.Popen(
        [sys.executable, "-m", "service.main", "dlq", "replay", "--quiet"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    ) as killed:
        await eventually(lambda: replayed_ns(replay.bootstrap, replay.topic), lambda n: n.total() >= 200)
        killed.kill()
    before = await replayed_ns(replay.bootstrap, replay.topic)
    assert before.total() < 3000, "the replay finished before it was killed"

    resumed = cli("dlq", "replay", "--quiet", **env)
    assert resumed.returncode == 0, resumed.stderr
    after = await replayed_ns(replay.bootstrap, replay.topic)
    assert set(after) == set(range(3000)) and after.total() - 3000 <= 1
    assert json.loads(resumed.stdout)["replayed"] in {3000 - before.total(), 3000 - before.total() + 1}


async def test_a_long_replay_reports_progress(replay: Replay) -> None:
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["model_rejected"] * 25)
    lines: list[str] = []
    ticks = Progress(lines.append, every=10, every_s=3600)

    def progress(report: ReplayReport) -> None:
        ticks.tick(report.read, report.line)

    await replay_dead_letters(replay, progress)
    assert lines == ["read 10, replayed 10, skipped 0", "read 20, replayed 20, skipped 0"]
    lines.clear()
    await replay_dead_letters(replay, progress)
    assert lines == []  # nothing left to read


async def test_the_command_prints_json_on_stdout_and_progress_on_stderr(replay: Replay) -> None:
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["model_rejected"] * 1005)
    env = cli_env(replay)

    dry = cli("dlq", "replay", "--dry-run", **env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["wouldReplay"] == 1005 and "replayed" not in json.loads(dry.stdout)
    assert "mao-memory: dlq replay: read 1000, would replay 1000, skipped 0 so far" in dry.stderr.splitlines()
    run = cli("dlq", "replay", "--quiet", **env)
    assert run.returncode == 0 and run.stderr == ""
    summary = json.loads(run.stdout)
    assert (summary["dryRun"], summary["replayed"], summary["group"]) == (False, 1005, replay.group)
    again = cli("dlq", "replay", **env)
    assert json.loads(again.stdout)["replayed"] == 0
    assert again.stderr.splitlines() == [
        f"mao-memory: dlq replay done: read 0, replayed 0, skipped 0 ({replay.group})"
    ]


async def test_a_broker_refusing_the_idempotent_producer_stops_the_replay_in_one_line(replay: Replay) -> None:
    """Tansu refuses InitProducerId, as a cluster without idempotence would: nothing is read or
    committed, and the command says why in one line, not a traceback."""
    await dead_letters(replay.bootstrap, replay.dlq_topic, ["model_rejected"] * 3)
    refused = cli("dlq", "replay", "--quiet", **(cli_env(replay) | {"MEMORY_KAFKA_DLQ_IDEMPOTENCE": "true"}))
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["read"] == 0
    [said] = [line for line in refused.stderr.splitlines() if line.startswith("mao-memory:")]
    assert (
        said.startswith("mao-memory: dlq replay stopped (UnknownError") and "Traceback" not in refused.stderr
    )
    run = cli("dlq", "replay", "--quiet", **cli_env(replay))
    assert json.loads(run.stdout)["replayed"] == 3

"""The embedded mode's broker (playground/broker.py): kombu's filesystem transport, with
messages that appear whole.

kombu's own transport creates a message's file under its final name and writes it after;
a worker polling in between read it empty, and stopped for good ("Unrecoverable error:
JSONDecodeError"), taking `make run` down with it. A slow disk widens that window to each
write's wait: the slow-disk test of `make run` met it in CI."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from kombu import Connection

from tests.servers import ROOT, embedded_env, manage
from tests.slow_disk import slow_disk

WRITE_DELAY_MS = 500


def _connection(folder: Path) -> Connection:
    return Connection(
        "filesystem://",
        transport="playground.broker:Transport",
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(folder.parent / "control"),
        },
    )


def test_a_message_is_never_visible_to_a_reader_before_it_is_whole(tmp_path):
    """While a message is written on a slow disk, the queue folder is watched at full speed
    (through the disk's backing directory): every file a reader would take (kombu's reader
    takes the names whose part after the first dot is `<queue>.msg`) holds a whole message.
    kombu's own transport showed its file empty for the whole of the write's wait."""
    with slow_disk(tmp_path / "disk") as disk:
        folder = disk.mount / "queue"
        folder.mkdir()
        (disk.mount / "control").mkdir()
        disk.set_delay_ms(WRITE_DELAY_MS)
        published = {"body": "x" * 5000}
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                with _connection(folder) as connection:
                    connection.SimpleQueue("celery").put(published)
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)

        writer = threading.Thread(target=publish)
        writer.start()
        seen: dict[str, int] = {}
        looks = 0
        writing = True
        while writing:
            writing = writer.is_alive()  # one last look once it is done
            looks += 1
            for path in (disk.backing / "queue").iterdir():
                if path.name.partition(".")[2] == "celery.msg":
                    body = path.read_bytes()
                    json.loads(body)  # whole, or the reader would stop on it
                    seen[path.name] = len(body)
            time.sleep(0.01)
        assert not errors, errors
        assert looks > 50, looks  # watched throughout the seconds the writes took
        assert len(seen) == 1, seen  # and the message was there to see
        with _connection(folder) as connection:
            message = connection.SimpleQueue("celery").get(timeout=10)
            assert message.payload == published
            message.ack()
        assert not list((disk.backing / "queue").iterdir())


def test_the_embedded_worker_skips_a_message_that_does_not_parse_and_goes_on(tmp_path):
    var = tmp_path / "var"
    env = embedded_env(var, tmp_path / "jails")
    manage(env, "migrate", "--noinput")
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "playground", "worker", "--pool=solo",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for(log, worker, "ready.")
        # A torn message, as the old transport could leave one, ahead of a real task.
        (var / "celery-broker/queue/1_torn.celery.msg").write_text('{"body": "eyJ')
        manage(
            env,
            "shell",
            "-c",
            "from sandboxes.tasks import check_docker_engines; check_docker_engines.delay()",
        )
        _wait_for(log, worker, "check_docker_engines[")
        _wait_for(log, worker, "succeeded in")
        output = log.read_text()
        assert "Skipped a broker message that does not parse" in output, output[-3000:]
        assert output.index("Skipped a broker message") < output.index("succeeded in")
        assert "Unrecoverable error" not in output, output[-3000:]
        assert worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(20)


def _wait_for(log: Path, worker: subprocess.Popen[bytes], text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in log.read_text():
        assert worker.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)

"""Ctrl-C in the memplan command: one line on stderr, exit status 130, no traceback, no partial output file, and no
worker process left running."""
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from planner import cli, outputs
from planner.interrupt import INTERRUPTED

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and sends POSIX signals")
INTERRUPTED_LINE = "memplan: interrupted\n"


def memplan(*argv, stderr=subprocess.PIPE):
    """The memplan command started in a process group of its own (as a shell's job is)."""
    return subprocess.Popen([sys.executable, "-m", "planner.cli", *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)


def group(pgid):
    """The processes of process group `pgid` that have not exited (the fifth field of /proc/PID/stat)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != "Z":
            found.append(int(entry))
    return found


def wait_for(condition, seconds=120):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the command never got there"
        time.sleep(0.05)


def test_ctrl_c_ends_fit_and_its_worker_processes(tmp_path):
    out = tmp_path / "fit.json"
    child = memplan("fit", "zoo:lenet", "--batch", "8", "--gpus", "8", "--memory", "64GiB", "--workers", "2", "--json",
                    "-o", str(out))
    wait_for(lambda: len(group(child.pid)) >= 3 or child.poll() is not None)  # the command and its two workers
    os.kill(child.pid, signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == INTERRUPTED and err.decode() == INTERRUPTED_LINE, err.decode()
    assert group(child.pid) == [] and not out.exists() and os.listdir(tmp_path) == []


def test_ctrl_c_on_a_terminal_wipes_the_progress_line(tmp_path):
    import pty
    out = tmp_path / "rows.json"
    terminal, end = pty.openpty()
    child = memplan("max-batch", "zoo:resnet18", "--budget", "64GiB", "--json", "-o", str(out), stderr=end)
    os.close(end)
    shown = b""
    try:
        def read():
            nonlocal shown
            if select.select([terminal], [], [], 0.05)[0]:
                shown += os.read(terminal, 4096)
            return b"memplan max-batch:" in shown
        wait_for(read)
        os.killpg(child.pid, signal.SIGINT)  # as Ctrl-C does: to the whole foreground group
        child.wait(timeout=60)
        while True:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(terminal)
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for line in shown.decode().split("\n")]
    assert child.returncode == INTERRUPTED and [line for line in lines if line] == [INTERRUPTED_LINE.strip()], shown
    assert not out.exists() and os.listdir(tmp_path) == []


def interrupted(argv, after=0.5):
    """cli.main(argv) in this process, with SIGINT sent to it `after` seconds into the command (once the command's
    handler is in place, so that the test run itself is never interrupted)."""
    python = signal.getsignal(signal.SIGINT)

    def later():
        wait_for(lambda: signal.getsignal(signal.SIGINT) is not python, 60)
        time.sleep(after)
        if signal.getsignal(signal.SIGINT) is not python:
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=later, daemon=True)
    sender.start()
    try:
        return cli.main(argv)
    finally:
        sender.join()


@pytest.mark.parametrize("argv", [
    ["run", "zoo:lenet", "--batch", "2", "--backend", "numpy", "--no-jit", "--repeat", "3000"],
    ["report", "zoo:resnet50", "--batch", "4", "--training", "--json", "-o", "{tmp}/report.json"],
], ids=["run", "report"])
def test_ctrl_c_ends_a_command_in_one_line(argv, tmp_path, capsys):
    assert interrupted([a.format(tmp=tmp_path) for a in argv]) == INTERRUPTED
    assert capsys.readouterr().err == INTERRUPTED_LINE
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and os.listdir(tmp_path) == []


def test_an_output_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("the last plan\n")
    with pytest.raises(KeyboardInterrupt):
        with outputs.written(path) as temporary:
            temporary.write_text("half a pl")
            temporary.with_suffix(".npz").write_text("half")
            raise KeyboardInterrupt
    assert path.read_text() == "the last plan\n" and os.listdir(tmp_path) == ["plan.json"]
    with outputs.written(path) as temporary:
        temporary.write_text("a plan\n")
        temporary.with_suffix(".npz").write_text("its values")
    assert path.read_text() == "a plan\n" and sorted(os.listdir(tmp_path)) == ["plan.json", "plan.npz"]
    with outputs.written(os.devnull) as temporary:
        assert str(temporary) == os.devnull  # not a regular file: written as it is, never replaced

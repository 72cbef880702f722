"""`kvpool chat` in a pseudo-terminal: two turns, the second reusing the first's KV, then a save
and a load in a new process that continues the conversation."""
import os
import pty
import re
import select
import subprocess
import time

from conftest import KVPOOL, MODEL, ROOT, require_model


def read_until(fd, pattern, timeout=120):
    out = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if re.search(pattern, out.decode(errors="replace")):
                return out.decode(errors="replace")
    raise AssertionError(f"no {pattern!r} in {out.decode(errors='replace')!r}")


def start_chat():
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(KVPOOL), "chat", "--model", str(MODEL), "--threads", "2",
                             "--kv-memory", "128MiB", "--temperature", "0", "-n", "16"],
                            stdin=slave, stdout=slave, stderr=slave, cwd=ROOT)
    os.close(slave)
    return proc, master


def test_two_turns_then_save_and_load(tmp_path):
    require_model()
    proc, fd = start_chat()
    try:
        read_until(fd, r"> $")
        os.write(fd, b"What is the capital of France?\n")
        first = read_until(fd, r"reused\s*\r?\n> $")
        assert "Paris" in first
        assert re.search(r"\[kvpool\] 0 tokens of the conversation reused", first)
        os.write(fd, b"And of Italy?\n")
        second = read_until(fd, r"reused\s*\r?\n> $")
        reused = int(re.search(r"\[kvpool\] (\d+) tokens of the conversation reused",
                               second).group(1))
        assert reused > 20, second
        path = tmp_path / "conv.kvc"
        os.write(fd, f"/save {path}\n".encode())
        read_until(fd, r"saved to .*4 messages")
        os.write(fd, b"/exit\n")
        proc.wait(30)
    finally:
        proc.kill()
        os.close(fd)
    assert path.exists() and (tmp_path / "conv.kvc.json").exists()
    proc, fd = start_chat()
    try:
        read_until(fd, r"> $")
        os.write(fd, f"/load {path}\n".encode())
        read_until(fd, r"loaded from .*4 messages")
        os.write(fd, b"And of Spain?\n")
        third = read_until(fd, r"reused\s*\r?\n> $")
        reused = int(re.search(r"\[kvpool\] (\d+) tokens of the conversation reused",
                               third).group(1))
        assert reused > 30, third
        os.write(fd, b"/exit\n")
        proc.wait(30)
    finally:
        proc.kill()
        os.close(fd)

"""Fixtures of the server suite: a real `kvpool serve` on the default model, on the CPU, on a
free localhost port, driven over HTTP only (the openai client where it fits, raw HTTP for what the
client will not send). Each server is started once per module that asks for it and stopped with
SIGTERM at the end."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KVPOOL = Path(os.environ.get("KVPOOL_BIN", ROOT / "build/release/apps/kvpool"))
MODEL = ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATES = ROOT / "tests/server/fixtures/templates"


class Server:
    """One running `kvpool serve`; `args` are added to the defaults."""

    def __init__(self, *args, tmp=None, env=None, model_args=None):
        model_args = ["--model", str(MODEL)] if model_args is None else list(map(str, model_args))
        self.args = [str(KVPOOL), "serve", *model_args, "--port", "0",
                     "--threads", "2", "--kv-memory", "256MiB", *map(str, args)]
        self.log_path = Path(tmp or "/tmp") / f"kvpool-serve-{os.getpid()}-{id(self)}.log"
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=ROOT, env=env)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            text = self.log_path.read_text()
            m = re.search(r"listening on http://[^:]+:(\d+)", text)
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpool serve exited {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("kvpool serve did not start in 60 s:\n" + self.log_path.read_text())
        self.url = f"http://127.0.0.1:{self.port}"

    def output(self):
        return self.log_path.read_text()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("kvpool serve did not stop after " + sig.name)
        return self.proc.returncode

    # raw HTTP
    def request(self, method, path, body=None, headers=None, raw=None, timeout=120):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def json(self, method, path, body=None, headers=None, **kw):
        status, hdrs, text = self.request(method, path, body, headers, **kw)
        return status, json.loads(text) if text.strip() else None

    def metrics(self, headers=None):
        from prometheus_client.parser import text_string_to_metric_families
        status, _, text = self.request("GET", "/metrics", headers=headers)
        assert status == 200, text
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = s.name + ("" if not s.labels else
                                "{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}")
                samples[key] = s.value
        return samples

    def client(self, api_key="none", **kw):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                             timeout=120, **kw)


def require_model():
    if not KVPOOL.exists():
        pytest.fail(f"{KVPOOL} is not built (make build)")
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing (scripts/fetch_models.sh)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server with default options."""
    require_model()
    s = Server("--max-seqs", "16", tmp=tmp_path_factory.mktemp("serve"))
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture
def start_server(tmp_path):
    """Starts servers with given options; stops them at the end of the test."""
    require_model()
    started = []

    def start(*args, **kw):
        s = Server(*args, tmp=tmp_path, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def sse_events(server, path, body, headers=None, timeout=120):
    """The data payloads of a streamed response, as (parsed JSON | '[DONE]')."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body),
                 {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    events = []
    for line in resp.read().decode().split("\n"):
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    conn.close()
    return events

"""`kvpool serve --random-model NAME --tokenizer PATH`: a model shape with random weights behind the
server (how the server is benchmarked on a shape whose weights cannot travel, e.g. the 8B shape on
the GPU machine), with the filler tokenizer of scripts/make_filler_tokenizer.py. Checked here on
the CPU with the SmolLM2-135M shape (vocab 49152)."""
import subprocess
import sys

import pytest

from conftest import KVPOOL, ROOT, Server, sse_events

VOCAB = 49152  # the smollm2-135m shape's


@pytest.fixture(scope="module")
def filler_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("filler")
    subprocess.run([sys.executable, ROOT / "scripts/make_filler_tokenizer.py", "--vocab",
                    str(VOCAB), "--out", folder], check=True)
    return folder


@pytest.fixture(scope="module")
def random_server(filler_tokenizer, tmp_path_factory):
    s = Server("--max-seqs", "8", tmp=tmp_path_factory.mktemp("serve-random"),
               model_args=["--random-model", "smollm2-135m", "--tokenizer", filler_tokenizer])
    yield s
    assert s.stop() == 0, s.output()


def test_the_filler_tokenizer_decodes_as_hugging_face_tokenizers_does(random_server,
                                                                      filler_tokenizer):
    from tokenizers import Tokenizer
    reference = Tokenizer.from_file(str(filler_tokenizer / "tokenizer.json"))
    assert reference.get_vocab_size() == VOCAB
    ids = [0, 65, 255, 256, 1000, 31337, VOCAB - 2, 300, 32, 400]
    status, body = random_server.json("POST", "/detokenize", {"tokens": ids})
    assert status == 200, body
    assert body["prompt"] == reference.decode(ids, skip_special_tokens=False)
    text = "Hello, wörld w300"
    status, body = random_server.json("POST", "/tokenize",
                                      {"prompt": text, "add_special_tokens": False})
    assert status == 200, body
    assert body["tokens"] == reference.encode(text, add_special_tokens=False).ids


def test_completions_on_token_ids_return_every_token_asked_for(random_server):
    status, models = random_server.json("GET", "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "smollm2-135m-random", models
    prompt = list(range(1000, 1100))
    status, body = random_server.json("POST", "/v1/completions", {
        "model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert body["usage"]["completion_tokens"] == 12
    assert body["choices"][0]["finish_reason"] == "length"
    # greedy on the same weights: the same text again, now with the prompt cached
    status, again = random_server.json("POST", "/v1/completions", {
        "model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert status == 200 and again["choices"][0]["text"] == body["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 96
    events = sse_events(random_server, "/v1/completions", {
        "model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
        "stream": True})
    assert events[-1] == "[DONE]"
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert streamed == body["choices"][0]["text"]


def test_chat_is_refused_without_a_template(random_server):
    status, body = random_server.json("POST", "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert status == 400, body
    assert "template" in body["error"]["message"]


@pytest.mark.parametrize("args, message", [
    (["--random-model", "smollm2-135m"], "needs --tokenizer"),
    (["--random-model", "smollm2-135m", "--model", "x.gguf"], "not both"),
    (["--model", "models/SmolLM2-135M-Instruct.Q4_1.gguf", "--tokenizer", "t"],
     "--tokenizer goes with --random-model"),
    (["--random-model", "no-such-shape", "--tokenizer", "FILLER"], "unknown shape"),
    (["--random-model", "smollm2-135m", "--tokenizer", "SMALL"], "fewer than random model"),
])
def test_bad_random_model_options_are_named(args, message, filler_tokenizer, tmp_path):
    small = tmp_path / "small"
    subprocess.run([sys.executable, ROOT / "scripts/make_filler_tokenizer.py", "--vocab", "1000",
                    "--out", small], check=True)
    args = [str(filler_tokenizer) if a == "FILLER" else str(small) if a == "SMALL" else a
            for a in args]
    r = subprocess.run([str(KVPOOL), "serve", *args, "--port", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr

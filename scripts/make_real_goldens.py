#!/usr/bin/env python3
"""Greedy continuations of a real GGUF model by Hugging Face transformers, the reference for
kvpool's real-model test (tests/model/real_model_test.cc).

transformers loads the GGUF file itself (dequantised to float32 with the gguf package, the
tokenizer rebuilt from the file's metadata) and runs on the CPU in float32. For each prompt it
records the prompt's token ids and 32 greedy tokens (min_new_tokens = max_new_tokens, so the
end-of-sequence logit is masked at every step, as kvpool's test does with min_tokens), and the
smallest top-1/top-2 logit margin along the path (how robust the golden is to rounding).
Run where torch and transformers exist (the GPU machine):
  python3 scripts/make_real_goldens.py MODEL.gguf OUT.json
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "<|im_start|>user\nWhat is the boiling point of water in Celsius?<|im_end|>\n"
    "<|im_start|>assistant\n",
]
NEW_TOKENS = 32


def main(path, out):
    directory, name = os.path.split(os.path.abspath(path))
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                 dtype=torch.float32)
    model.eval()
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
        margins = []
        for scores in gen.scores:
            top = torch.topk(scores[0].float(), 2).values
            margins.append(float(top[0] - top[1]))
        new = gen.sequences[0, ids.shape[1]:].tolist()
        cases.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "greedy": new,
                      "min_margin": min(margins), "text": tok.decode(new)})
        print(json.dumps(cases[-1])[:300], flush=True)
    json.dump({"model": name, "torch": torch.__version__,
               "transformers": transformers.__version__, "dtype": "float32", "device": "cpu",
               "new_tokens": NEW_TOKENS, "cases": cases}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Renders the chat templates Qwen3.5, Qwen3-Coder, Gemma 4 and gpt-oss checkpoints publish with
transformers' own renderer, for conversations that use what those templates handle: a system
prompt, tools, assistant tool calls with their results, reasoning, template keyword arguments.
The chat-template test renders the same with mlx-serve and compares.

The templates come from llama.cpp's copies of the published ones (`models/templates/`, named by
model), as the `llama-cpp-python` source package on PyPI vendors them (this machine reaches no
model hub): read from the archive, nothing of it built or run. The archive (~75 MB) is
downloaded once into CACHE_DIR.

usage: python render_templates.py CACHE_DIR OUT_JSON
"""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

LLAMA_CPP_PYTHON = "0.3.36"
# Our name -> (llama.cpp's file, the checkpoint's bos and eos tokens).
TEMPLATES = {
    "qwen3_5": ("Qwen3.5-4B.jinja", None, "<|im_end|>"),
    "qwen3_coder": ("Qwen3-Coder.jinja", None, "<|im_end|>"),
    "gemma4": ("google-gemma-4-31B-it.jinja", "<bos>", "<turn|>"),
    "gpt_oss": ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>"),
}


def read_templates(cache: Path) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(cache),
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/models/templates/"
    wanted = {prefix + file: ours for ours, (file, _, _) in TEMPLATES.items()}
    found = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.name in wanted:
                found[wanted[member.name]] = tar.extractfile(member).read().decode()
    missing = set(TEMPLATES) - set(found)
    assert not missing, f"templates not found in {archive.name}: {missing}"
    return found


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "description": "City name"},
               "days": {"type": "integer", "description": "How many days"},
               "units": {"type": "string", "enum": ["C", "F"]}},
               "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
        "parameters": {"type": "object", "properties": {}}}}

CONVERSATIONS = [
    ("plain", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
               {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}], None, {}),
    ("tools", [{"role": "user", "content": "Weather in Paris for 2 days?"},
               {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
               {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
               {"role": "assistant", "content": "21 degrees and clear."},
               {"role": "user", "content": "And the time?"}], [WEATHER, TIME], {}),
    ("reasoning", [{"role": "system", "content": "Think first."}, {"role": "user", "content": "Is 91 prime?"},
                   {"role": "assistant", "content": "No: 7 x 13.", "reasoning_content": "91 = 7 * 13", "thinking": "91 = 7 * 13"},
                   {"role": "user", "content": "And 97?"}], None, {"enable_thinking": True, "reasoning_effort": "high"}),
]


def main():
    cache, out = Path(sys.argv[1]), Path(sys.argv[2])
    cases = []
    for name, template in read_templates(cache).items():
        _, bos, eos = TEMPLATES[name]
        for case, messages, tools, kwargs in CONVERSATIONS:
            specials = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
            rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                                add_generation_prompt=True, **specials, **kwargs)
            cases.append({"template_name": name, "case": case, "template": template, "bos_token": bos, "eos_token": eos,
                          "messages": messages, "tools": tools, "kwargs": kwargs, "rendered": rendered[0]})
    out.write_text(json.dumps({"llama_cpp_python": LLAMA_CPP_PYTHON, "cases": cases}))
    print(f"{len(cases)} renderings")


if __name__ == "__main__":
    main()

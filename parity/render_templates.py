"""Renders the chat templates Qwen3.5, Qwen3-Coder, Qwen3-Next (Instruct and Thinking), Gemma 4
and gpt-oss checkpoints publish with transformers' own renderer, for conversations that use what
those templates handle: a system prompt, tools, assistant tool calls with their results,
reasoning, template keyword arguments. The chat-template test renders the same with mlx-serve
and compares.

This machine reaches no model hub, so the templates come from copies of the published ones that
PyPI packages carry, read from the archives, nothing of them built or run, each downloaded once
into CACHE_DIR:
- llama.cpp's (`models/templates/`, named by model), as the `llama-cpp-python` source package
  vendors them (~75 MB);
- Xinference's model registry (`xinference/model/llm/models/*.json`, whose `chat_template` is the
  checkpoint's), in the `xinference` wheel (~56 MB): Qwen3-Next's, which llama.cpp has no copy of.

usage: python render_templates.py CACHE_DIR OUT_JSON
"""

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

LLAMA_CPP_PYTHON = "0.3.36"
XINFERENCE = "4.1.0"
# Our name -> (where the copy is: "llama.cpp" or "xinference", its file there, the checkpoint's
# bos and eos tokens).
TEMPLATES = {
    "qwen3_5": ("llama.cpp", "Qwen3.5-4B.jinja", None, "<|im_end|>"),
    "qwen3_coder": ("llama.cpp", "Qwen3-Coder.jinja", None, "<|im_end|>"),
    "qwen3_next": ("xinference", "Qwen3-Next-Instruct.json", None, "<|im_end|>"),
    "qwen3_next_thinking": ("xinference", "Qwen3-Next-Thinking.json", None, "<|im_end|>"),
    "gemma4": ("llama.cpp", "google-gemma-4-31B-it.jinja", "<bos>", "<turn|>"),
    "gpt_oss": ("llama.cpp", "openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>"),
}


def download(cache: Path, requirement: str, binary: bool) -> None:
    kind = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *kind, "-q", "-d", str(cache), requirement], check=True)


def llama_cpp_templates(cache: Path, files: dict) -> dict:
    """{our name: template} from llama.cpp's `models/templates/` files named in `files`."""
    archive = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not archive.exists():
        download(cache, f"llama-cpp-python=={LLAMA_CPP_PYTHON}", binary=False)
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/models/templates/"
    wanted = {prefix + file: ours for ours, file in files.items()}
    with tarfile.open(archive) as tar:
        return {wanted[m.name]: tar.extractfile(m).read().decode() for m in tar if m.name in wanted}


def xinference_templates(cache: Path, files: dict) -> dict:
    """{our name: template} from the `chat_template` of Xinference's model entries named in `files`
    (an entry is one object, or a list holding one)."""
    wheel = cache / f"xinference-{XINFERENCE}-py3-none-any.whl"
    if not wheel.exists():
        download(cache, f"xinference=={XINFERENCE}", binary=True)
    found = {}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for ours, file in files.items():
            path = f"xinference/model/llm/models/{file}"
            if path in names:
                entry = json.loads(z.read(path))
                found[ours] = (entry[0] if isinstance(entry, list) else entry)["chat_template"]
    return found


def read_templates(cache: Path) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    found = {}
    for source, read in (("llama.cpp", llama_cpp_templates), ("xinference", xinference_templates)):
        found |= read(cache, {ours: file for ours, (where, file, _, _) in TEMPLATES.items() if where == source})
    missing = set(TEMPLATES) - set(found)
    assert not missing, f"templates not found: {missing}"
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
        _, _, bos, eos = TEMPLATES[name]
        for case, messages, tools, kwargs in CONVERSATIONS:
            specials = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
            rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                                add_generation_prompt=True, **specials, **kwargs)
            cases.append({"template_name": name, "case": case, "template": template, "bos_token": bos, "eos_token": eos,
                          "messages": messages, "tools": tools, "kwargs": kwargs, "rendered": rendered[0]})
    out.write_text(json.dumps({"llama_cpp_python": LLAMA_CPP_PYTHON, "xinference": XINFERENCE, "cases": cases}))
    print(f"{len(cases)} renderings")


if __name__ == "__main__":
    main()

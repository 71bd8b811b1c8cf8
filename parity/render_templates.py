"""Renders the chat templates Gemma 4 (plain and thinking) and gpt-oss checkpoints publish with
transformers' own renderer, for conversations that use what those templates handle: a system
prompt, tools, assistant tool calls with their results, reasoning, template keyword arguments.
The chat-template test renders the same with mlx-serve and compares.

The templates come from the `unsloth` wheel on PyPI (this machine reaches no model hub), whose
chat_templates.py keeps them as string literals: they are read from its syntax tree; nothing of
the wheel is imported or run. The wheel is downloaded once into CACHE_DIR.

usage: python render_templates.py CACHE_DIR OUT_JSON
"""

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

UNSLOTH = "2026.10.9"
# Our name -> the variable holding the template in unsloth/chat_templates.py.
TEMPLATES = {"gemma4": "gemma4_template", "gemma4_thinking": "gemma4_thinking_template", "gpt_oss": "gptoss_template"}
SPECIALS = {"gemma4": ("<bos>", "<turn|>"), "gemma4_thinking": ("<bos>", "<turn|>"), "gpt_oss": ("<|startoftext|>", "<|return|>")}


def read_templates(cache: Path) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    pattern = f"unsloth-{UNSLOTH}-*.whl"
    if not any(cache.glob(pattern)):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), f"unsloth=={UNSLOTH}"], check=True)
    wheel = next(cache.glob(pattern))
    source = zipfile.ZipFile(wheel).read("unsloth/chat_templates.py").decode()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            for ours, var in TEMPLATES.items():
                if node.targets[0].id == var:
                    found[ours] = ast.literal_eval(node.value)
    missing = set(TEMPLATES) - set(found)
    assert not missing, f"templates not found in {wheel.name}: {missing}"
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
        bos, eos = SPECIALS[name]
        for case, messages, tools, kwargs in CONVERSATIONS:
            rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                                add_generation_prompt=True, bos_token=bos, eos_token=eos, **kwargs)
            cases.append({"template_name": name, "case": case, "template": template, "bos_token": bos, "eos_token": eos,
                          "messages": messages, "tools": tools, "kwargs": kwargs, "rendered": rendered[0]})
    out.write_text(json.dumps({"unsloth": UNSLOTH, "cases": cases}))
    print(f"{len(cases)} renderings")


if __name__ == "__main__":
    main()

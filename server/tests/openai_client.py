"""Drives a running mlx-serve with the official OpenAI Python client: chat
(non-stream and stream), text completions, tools, and an error. Exits non-zero
on the first failed check.

usage: python openai_client.py BASE_URL        (e.g. http://127.0.0.1:5413/v1)
"""

import sys

import openai
from openai import OpenAI


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}")
        sys.exit(1)
    print(f"ok: {what}")


def main():
    client = OpenAI(base_url=sys.argv[1], api_key="not-needed", max_retries=0)
    model = client.models.list().data[0].id
    check(bool(model), "models.list returns the served model")

    messages = [{"role": "user", "content": "hello model"}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=8, extra_body={"ignore_eos": True})
    check(r.object == "chat.completion", "chat completion object")
    check(r.choices[0].message.role == "assistant", "assistant message")
    check(r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8, "chat usage")

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    check(text == r.choices[0].message.content, "streamed chat text equals the non-streamed text")
    check(finish == "length" and usage is not None and usage.completion_tokens == 8, "stream finish and usage")

    c = client.completions.create(model=model, prompt="the model", max_tokens=5, logprobs=2, extra_body={"ignore_eos": True})
    check(c.object == "text_completion" and len(c.choices[0].logprobs.tokens) == 5, "completion with logprobs")
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt="the model", max_tokens=5, stream=True, extra_body={"ignore_eos": True}) if ch.choices)
    check(streamed == c.choices[0].text, "streamed completion equals the non-streamed one")

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    t = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=4)
    check(t.choices[0].finish_reason in ("stop", "length", "tool_calls"), "chat with tools answers")

    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=4)
        check(False, "empty messages are refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "messages" in str(e), "empty messages are refused with 400")
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
        check(False, "an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "an unknown model is refused with 404")
    print("openai client: all checks passed")


if __name__ == "__main__":
    main()

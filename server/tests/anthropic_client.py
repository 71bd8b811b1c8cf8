"""Drives a running mlx-serve with the official Anthropic Python client: messages
(non-stream and stream), a system prompt, tools with a tool_use / tool_result
turn, count_tokens, the x-api-key header and errors. Exits non-zero on the first
failed check.

usage: python anthropic_client.py BASE_URL API_KEY   (e.g. http://127.0.0.1:5413 k)
The server must run with --api-key API_KEY and --prompt-cache-bytes 0 (so that
usage.input_tokens counts the whole prompt).
"""

import sys

import anthropic
from anthropic import Anthropic

from client_checks import check


def main():
    base, key = sys.argv[1], sys.argv[2]
    client = Anthropic(base_url=base, api_key=key, max_retries=0)
    model = "default_model"
    messages = [{"role": "user", "content": "hello model"}]
    # This client version has no sampling parameters: they go in the body as extra fields.
    greedy = {"extra_body": {"ignore_eos": True, "temperature": 0}}

    r = client.messages.create(model=model, max_tokens=8, messages=messages, system="Be brief.", **greedy)
    check(r.type == "message" and r.role == "assistant", "message object")
    check(r.id.startswith("msg"), "message id")
    check([b.type for b in r.content] == ["text"] and r.content[0].text, "one text block")
    check(r.stop_reason == "max_tokens" and r.usage.output_tokens == 8, "stop_reason max_tokens after 8 tokens")

    counted = client.messages.count_tokens(model=model, messages=messages, system="Be brief.")
    check(counted.input_tokens == r.usage.input_tokens > 0, "count_tokens equals the prompt's usage.input_tokens")

    with client.messages.stream(model=model, max_tokens=8, messages=messages, system="Be brief.", **greedy) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == r.content[0].text, "the stream's text equals the whole answer (greedy)")
    check(final.stop_reason == "max_tokens" and final.usage.output_tokens == 8, "the stream's final message")

    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    turn = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny"}]},
    ]
    r = client.messages.create(model=model, max_tokens=6, messages=turn, tools=tools, tool_choice={"type": "auto"}, **greedy)
    check(r.stop_reason in ("max_tokens", "end_turn", "tool_use"), "a tool_use / tool_result conversation is answered")
    with_tools = client.messages.count_tokens(model=model, messages=turn, tools=tools).input_tokens
    without = client.messages.count_tokens(model=model, messages=turn).input_tokens
    check(with_tools > without, "tools reach the chat template")

    # Forced calls (the test model has random weights: only the constraint makes these valid).
    bounded = [{"name": n, "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                             "required": ["city"], "additionalProperties": False}} for n in ("get_weather", "get_time")]
    sampled = {"extra_body": {"temperature": 1.0, "seed": 3}}
    r = client.messages.create(model=model, max_tokens=300, messages=messages, tools=bounded, tool_choice={"type": "any"}, **sampled)
    uses = [b for b in r.content if b.type == "tool_use"]
    check(r.stop_reason == "tool_use" and uses and all(isinstance(u.input["city"], str) for u in uses), "tool_choice any gives tool_use blocks")
    r = client.messages.create(model=model, max_tokens=300, messages=messages, tools=bounded,
                               tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}, **sampled)
    uses = [b for b in r.content if b.type == "tool_use"]
    check(len(uses) == 1 and uses[0].name == "get_time", "tool_choice tool gives one call of that tool")
    try:
        client.messages.create(model=model, max_tokens=4, messages=messages, tools=bounded, tool_choice={"type": "tool", "name": "nope"})
        check(False, "an unknown tool name is refused")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error" and "nope" in str(e), "an unknown tool name gets invalid_request_error")
    try:
        client.messages.create(model="not-this-one", max_tokens=4, messages=messages)
        check(False, "an unknown model is refused")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", "an unknown model gets Anthropic's not_found_error")
    try:
        Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(model=model, max_tokens=4, messages=messages)
        check(False, "a wrong key is refused")
    except anthropic.AuthenticationError as e:
        check(e.body["type"] == "error" and e.body["error"]["type"] == "authentication_error", "a wrong x-api-key gets authentication_error")
    try:
        client.messages.create(model=model, messages=messages, max_tokens=0)
        check(False, "max_tokens 0 is refused")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error", "a bad max_tokens gets invalid_request_error")
    print("anthropic client: all checks passed")


if __name__ == "__main__":
    main()

"""Drives a running mlx-serve with the official OpenAI Python client: chat
(non-stream and stream), text completions, tools, structured output
(response_format, chat.completions.parse and responses.parse with pydantic
models, tool_choice), the Responses API (create, stream,
previous_response_id, retrieve), and errors. Exits non-zero on the first
failed check.

usage: python openai_client.py BASE_URL        (e.g. http://127.0.0.1:5413/v1)
The server must run with --tool-call-parser hermes (the test model's template
shows no tool format).
"""

import json
import sys
from typing import List, Literal

import openai
import pydantic
from openai import OpenAI

from client_checks import check


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
    responses(client, model)
    structured(client, model)
    print("openai client: all checks passed")


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]
    high: int = pydantic.Field(ge=-40, le=50)
    tags: List[Literal["sun", "rain", "wind"]] = pydantic.Field(max_length=3)


def structured(client, model):
    """Structured output and forced tool calls, as SDK users write them. The
    test model has random weights: only the constraint makes these valid."""
    messages = [{"role": "user", "content": "The forecast for Paris, as JSON."}]
    sampled = {"temperature": 1.0, "seed": 7, "max_tokens": 300}
    parsed = client.chat.completions.parse(model=model, messages=messages, response_format=Forecast, **sampled)
    p = parsed.choices[0].message.parsed
    check(isinstance(p, Forecast) and len(p.city) <= 10 and -40 <= p.high <= 50, "chat.completions.parse returns a valid pydantic object")
    beta = client.beta.chat.completions.parse(model=model, messages=messages, response_format=Forecast, **dict(sampled, seed=8))
    check(isinstance(beta.choices[0].message.parsed, Forecast), "beta.chat.completions.parse returns a valid pydantic object")

    r = client.chat.completions.create(model=model, messages=messages, response_format={"type": "json_object"}, **sampled)
    check(r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict),
          "response_format json_object gives a JSON object")

    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": False}}}
        for n in ("get_weather", "get_time")]
    r = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="required", **sampled)
    calls = r.choices[0].message.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and calls and all(c.function.name in ("get_weather", "get_time") for c in calls),
          "tool_choice required gives tool calls")
    check(all(isinstance(json.loads(c.function.arguments)["city"], str) for c in calls), "the calls' arguments follow the tool's schema")
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice=named, parallel_tool_calls=False, **sampled)
    calls = r.choices[0].message.tool_calls or []
    check(len(calls) == 1 and calls[0].function.name == "get_time", "a named tool_choice gives one call of that function")
    try:
        client.chat.completions.create(model=model, messages=messages, tools=tools,
                                       tool_choice={"type": "function", "function": {"name": "nope"}}, max_tokens=4)
        check(False, "an unknown tool name is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and (e.body or {}).get("param") == "tool_choice", "an unknown tool name gets 400 naming tool_choice")

    rp = client.responses.parse(model=model, input="The forecast for Paris.", text_format=Forecast, max_output_tokens=300, temperature=1.0)
    check(isinstance(rp.output_parsed, Forecast), "responses.parse returns a valid pydantic object")
    flat = [{"type": "function", "name": "get_weather", "parameters": tools[0]["function"]["parameters"]}]
    rc = client.responses.create(model=model, input="Weather?", tools=flat, tool_choice="required", max_output_tokens=300, temperature=1.0)
    check("function_call" in [i.type for i in rc.output], "responses tool_choice required gives a function_call item")


def responses(client, model):
    """The Responses API, as Codex uses it."""
    greedy = {"extra_body": {"ignore_eos": True}, "temperature": 0}
    r = client.responses.create(model=model, input="hello model", instructions="Be brief.", max_output_tokens=8, **greedy)
    check(r.object == "response" and r.status == "incomplete", "a response cut at max_output_tokens is incomplete")
    check(r.incomplete_details.reason == "max_output_tokens", "incomplete_details names the reason")
    check(r.output[0].type == "message" and r.output_text, "one message item with output_text")
    check(r.usage.output_tokens == 8 and r.usage.total_tokens == r.usage.input_tokens + 8, "responses usage")

    with client.responses.stream(model=model, input="hello model", instructions="Be brief.", max_output_tokens=8, **greedy) as s:
        events = list(s)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(deltas == r.output_text, "the streamed deltas equal the whole response's text")
    # Cut at max_output_tokens, the stream ends with response.incomplete (as
    # OpenAI's does), which the SDK's get_final_response() does not accept.
    final = events[-1]
    check(final.type == "response.incomplete" and final.response.output_text == r.output_text, "the stream's final response")
    # A stop string from the answer's start ends it early: response.completed.
    stop = {"extra_body": {"ignore_eos": True, "stop": [r.output_text[:3]]}, "temperature": 0}
    with client.responses.stream(model=model, input="hello model", instructions="Be brief.", max_output_tokens=8, **stop) as s:
        whole = s.get_final_response()
    check(whole.status == "completed" and whole.output[0].type == "message", "an SDK stream accumulates a completed response")

    follow = client.responses.create(model=model, input="and then?", previous_response_id=r.id, max_output_tokens=4, **greedy)
    fresh = client.responses.create(model=model, input="and then?", max_output_tokens=4, **greedy)
    check(follow.usage.input_tokens > fresh.usage.input_tokens, "previous_response_id carries the conversation")
    check(client.responses.retrieve(r.id).output_text == r.output_text, "a stored response is retrieved by id")

    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "18C"}]
    t = client.responses.create(model=model, input=items, tools=tools, max_output_tokens=4, **greedy)
    check(t.status in ("completed", "incomplete"), "a function_call / function_call_output turn is answered")
    try:
        client.responses.create(model=model, input="x", previous_response_id="resp_nope", max_output_tokens=4)
        check(False, "an unknown previous_response_id is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "an unknown previous_response_id gets 404")
    try:
        client.responses.create(model=model, input="x", tools=[{"type": "web_search"}], max_output_tokens=4)
        check(False, "a web_search tool is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and (e.body or {}).get("param") == "tools[0].type", "a non-function tool gets 400 naming tools[0].type")


if __name__ == "__main__":
    main()

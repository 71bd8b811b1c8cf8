//! Structured output through the real server: `response_format` JSON schemas
//! and forced tool calls hold on a random-weight model (which would otherwise
//! write garbage), alone and in a batch with other constraints or none; bad
//! schemas and tool names get 400 naming the field.

mod common;

use common::models::model;
use common::server::TestServer;
use mlx_serve::metrics::counter_value;
use serde_json::{json, Value};

/// A small deterministic generator (the test must not depend on a seed source).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const NAMES: [&str; 8] = ["id", "name", "tags", "score", "ok", "kind", "items", "note"];

/// A random schema of the kinds structured-output clients send: nested objects
/// (required and optional fields), arrays, enums, bounded numbers, strings.
/// Strings and arrays are bounded so a model that never chooses to stop still
/// ends its JSON within the token budget.
fn random_schema(rng: &mut Lcg, depth: u32) -> Value {
    let kinds = if depth >= 2 { 6 } else { 8 };
    match rng.below(kinds) {
        0 => json!({"type": "string", "maxLength": 1 + rng.below(8)}),
        1 => {
            let min = rng.below(100) as i64 - 50;
            json!({"type": "integer", "minimum": min, "maximum": min + rng.below(1000) as i64})
        }
        2 => json!({"type": "number", "minimum": -2.5, "maximum": 1000.0}),
        3 => json!({"type": "boolean"}),
        4 => {
            let all = [json!("red"), json!("green"), json!(3), json!(null), json!("blue sky")];
            let n = 1 + rng.below(4) as usize;
            json!({"enum": all[..n].to_vec()})
        }
        5 => json!({"type": "null"}),
        6 => random_object(rng, depth + 1),
        _ => {
            let min = rng.below(2);
            json!({"type": "array", "items": random_schema(rng, depth + 1), "minItems": min, "maxItems": min + rng.below(3)})
        }
    }
}

fn random_object(rng: &mut Lcg, depth: u32) -> Value {
    let mut properties = serde_json::Map::new();
    let mut required = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let name = rng.pick(&NAMES).to_string();
        if properties.contains_key(&name) {
            continue;
        }
        if rng.below(3) > 0 {
            required.push(json!(name));
        }
        properties.insert(name, random_schema(rng, depth));
    }
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 400});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn schema_format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "out", "strict": true, "schema": schema}})
}

/// The answer's content, checked to be complete JSON valid under `schema`.
fn assert_follows(reply: &Value, schema: &Value) -> Value {
    let choice = &reply["choices"][0];
    let content = choice["message"]["content"].as_str().unwrap_or_else(|| panic!("no content: {reply}"));
    assert_eq!(choice["finish_reason"], "stop", "the grammar did not complete: {content:?}");
    let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("not JSON ({e}): {content:?}"));
    assert!(jsonschema::is_valid(schema, &value), "{value} does not follow {schema}");
    value
}

#[test]
fn every_output_follows_its_random_json_schema() {
    let s = TestServer::start(&model(), &[]);
    let mut rng = Lcg(2024);
    for case in 0..24 {
        let schema = random_object(&mut rng, 0);
        // Sampled (temperature 1): a random-weight model's greedy choice would be
        // one path; each seed takes another through the grammar.
        let body = chat("describe it", json!({"response_format": schema_format(&schema), "temperature": 1.0, "seed": case}));
        let r = s.post_json("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_follows(&r.json(), &schema);
    }
    // Without the constraint the same model writes no JSON at all.
    let free = s.post_json("/v1/chat/completions", &chat("describe it", json!({"max_tokens": 12, "seed": 0})));
    let text = free.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text:?}");
    // Every constrained step was masked, and the masks' host time is counted.
    let metrics = s.get("/metrics").body;
    let masked_steps = counter_value(&metrics, "mlx_serve_grammar_masks_total").unwrap();
    assert!(masked_steps >= 24.0 * 2.0, "{metrics}");
    assert!(counter_value(&metrics, "mlx_serve_grammar_mask_seconds_total").unwrap() > 0.0);
    // One row a step (the requests ran one at a time), each either uploaded or
    // found on the device: masks repeat (string bodies, keys), so most are found.
    let rows = |source: &str| counter_value(&metrics, &format!("mlx_serve_grammar_mask_rows_total{{source=\"{source}\"}}")).unwrap();
    let (uploaded, reused) = (rows("uploaded"), rows("reused"));
    assert_eq!(uploaded + reused, masked_steps, "{metrics}");
    assert!(uploaded > 0.0 && reused > uploaded, "uploaded {uploaded}, reused {reused}");
}

#[test]
fn rows_with_different_constraints_or_none_share_a_batch() {
    let s = TestServer::start(&model(), &["--prompt-cache-bytes", "0"]);
    let a = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": false});
    let b = json!({"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 4});
    let free = |prompt: &str| json!({"prompt": prompt, "max_tokens": 24, "ignore_eos": true});
    let alone: Vec<Value> = ["the model", "hello world cache"].iter().map(|p| s.post_json("/v1/completions", &free(p)).json()).collect();
    let steps_before = counter_value(&s.get("/metrics").body, "mlx_serve_decode_steps_total").unwrap();
    let rows_before = counter_value(&s.get("/metrics").body, "mlx_serve_decode_rows_total").unwrap();
    let (together, constrained) = std::thread::scope(|scope| {
        let free_rows: Vec<_> = ["the model", "hello world cache"]
            .iter()
            .map(|p| scope.spawn({ let s = &s; let body = free(p); move || s.post_json("/v1/completions", &body).json() }))
            .collect();
        let guided: Vec<_> = [&a, &b, &a]
            .iter()
            .enumerate()
            .map(|(i, schema)| {
                let body = chat("value", json!({"response_format": schema_format(schema), "temperature": 1.0, "seed": i}));
                scope.spawn({ let s = &s; move || s.post_json("/v1/chat/completions", &body).json() })
            })
            .collect();
        let together: Vec<Value> = free_rows.into_iter().map(|h| h.join().unwrap()).collect();
        (together, guided.into_iter().map(|h| h.join().unwrap()).collect::<Vec<Value>>())
    });
    for (x, y) in alone.iter().zip(&together) {
        assert_eq!(x["choices"][0]["text"], y["choices"][0]["text"], "an unconstrained row changed beside constrained ones");
    }
    for (reply, schema) in constrained.iter().zip([&a, &b, &a]) {
        assert_follows(reply, schema);
    }
    let metrics = s.get("/metrics").body;
    let steps = counter_value(&metrics, "mlx_serve_decode_steps_total").unwrap() - steps_before;
    let rows = counter_value(&metrics, "mlx_serve_decode_rows_total").unwrap() - rows_before;
    assert!(rows / steps > 1.5, "mean batch size {}: the rows were not batched", rows / steps);
}

// In the Hermes JSON format, in Qwen3-Coder's XML one, whose bare-text
// values the parser types by the tools' schemas, and in Gemma 4's literals.
#[test]
fn forced_tool_calls_are_valid_calls_of_the_tools() {
    for parser in ["hermes", "qwen3_coder", "gemma4"] {
        forced_calls_are_valid(parser);
    }
}

fn forced_calls_are_valid(parser: &str) {
    let s = TestServer::start(&model(), &["--tool-call-parser", parser]);
    let city = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "units": {"enum": ["C", "F"]}},
                      "required": ["city"], "additionalProperties": false});
    let hour = json!({"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}}, "required": ["hour"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": city}},
        {"type": "function", "function": {"name": "set_alarm", "parameters": hour}},
    ]);
    for (choice, parallel, only) in [(json!("required"), false, None), (json!({"type": "function", "function": {"name": "set_alarm"}}), true, Some("set_alarm"))] {
        for seed in 0..4 {
            let body = chat("do it", json!({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel, "temperature": 1.0, "seed": seed}));
            let r = s.post_json("/v1/chat/completions", &body).json();
            let choice0 = &r["choices"][0];
            assert_eq!(choice0["finish_reason"], "tool_calls", "{r}");
            let calls = choice0["message"]["tool_calls"].as_array().unwrap();
            assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{r}");
            for call in calls {
                let name = call["function"]["name"].as_str().unwrap();
                let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
                let schema = if name == "get_weather" { &city } else { &hour };
                assert!(only.is_none_or(|o| o == name), "{r}");
                assert!(jsonschema::is_valid(schema, &args), "{parser}: {args} for {name}");
            }
        }
    }
    // tool_choice none: the same request writes text, no call.
    let r = s.post_json("/v1/chat/completions", &chat("do it", json!({"tools": tools, "tool_choice": "none", "max_tokens": 8}))).json();
    assert_eq!(r["choices"][0]["message"]["tool_calls"], Value::Null, "{r}");
}

#[test]
fn bad_schemas_and_tool_names_get_400_naming_the_field() {
    let s = TestServer::start(&model(), &["--tool-call-parser", "hermes"]);
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let cases = [
        (json!({"response_format": schema_format(&json!({"type": "array", "uniqueItems": true}))}), "response_format.json_schema.schema", "uniqueItems"),
        (json!({"response_format": schema_format(&json!({"$ref": "#/$defs/missing"}))}), "response_format.json_schema.schema", "missing"),
        (json!({"response_format": schema_format(&json!("no"))}), "response_format.json_schema.schema", "JSON Schema"),
        (json!({"response_format": {"type": "xml"}}), "response_format.type", "xml"),
        (json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}), "tool_choice", "`g`"),
        (json!({"tool_choice": "required"}), "tool_choice", "tools"),
        (json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}], "tool_choice": "required"}), "tools", "not"),
    ];
    for (extra, param, says) in cases {
        let r = s.post_json("/v1/chat/completions", &chat("x", extra.clone()));
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{extra}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{extra}: {e}");
    }
    // On the Responses API, the schema's field is text.format.
    let r = s.post_json("/v1/responses", &json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object", "if": {}}}}}));
    assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("text.format.schema")), "{}", r.body);
    // The server still answers.
    assert_eq!(s.post_json("/v1/chat/completions", &chat("x", json!({"max_tokens": 2}))).status, 200);
}

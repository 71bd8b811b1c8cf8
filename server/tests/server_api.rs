//! The HTTP server end to end: a real `mlx-serve` process on a free port,
//! serving a tiny mlx-lm-built model, driven over HTTP.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::models::{long_context_model, model, quantizable_kv_model, THINKING_TEMPLATE};
use common::server::{sse_events, TestServer};
use mlx_serve::metrics::counter_value;
use serde_json::{json, Value};

fn chat_body(content: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 16, "ignore_eos": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn metric(server: &TestServer, name: &str) -> f64 {
    counter_value(&server.metrics(), name).unwrap_or(0.0)
}

#[test]
fn chat_stream_is_openai_sse_byte_for_byte() {
    let s = TestServer::start(&model(), &[]);
    let r = s.post_json("/v1/chat/completions", &chat_body("hello model", json!({"stream": true, "max_tokens": 6, "stream_options": {"include_usage": true}})));
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("text/event-stream"), "{}", r.content_type);
    // Every event is exactly "data: <payload>\n\n" and the stream ends with [DONE].
    assert!(r.body.starts_with("data: {"), "{}", r.body);
    assert!(r.body.ends_with("\n\ndata: [DONE]\n\n"), "{}", r.body);
    for block in r.body.trim_end_matches("\n\n").split("\n\n") {
        assert!(block.starts_with("data: ") && !block.contains('\n'), "malformed event {block:?}");
    }
    let events = sse_events(&r.body);
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for c in &chunks {
        assert_eq!(c["id"], id);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c["created"].is_u64());
        assert!(c.get("usage").is_some(), "include_usage puts usage (null) on every chunk: {c}");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage_chunk = &chunks[chunks.len() - 1];
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 6);
    // Content deltas carry text only; they add up to the non-streamed answer.
    let streamed: String = chunks[1..chunks.len() - 2]
        .iter()
        .map(|c| {
            assert!(c["choices"][0]["finish_reason"].is_null());
            c["choices"][0]["delta"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    let whole = s.post_json("/v1/chat/completions", &chat_body("hello model", json!({"max_tokens": 6}))).json();
    assert_eq!(streamed, whole["choices"][0]["message"]["content"].as_str().unwrap());
    // mlx_lm.server's alias without /v1 answers the same.
    let alias = s.post_json("/chat/completions", &chat_body("hello model", json!({"max_tokens": 6})));
    assert_eq!(alias.status, 200, "{}", alias.body);
    assert_eq!(alias.json()["choices"][0]["message"]["content"], whole["choices"][0]["message"]["content"]);
}

#[test]
fn non_stream_objects_have_openai_shape_and_exact_usage() {
    let s = TestServer::start(&model(), &[]);
    let r = s.post_json("/v1/chat/completions", &chat_body("the cache", json!({"max_tokens": 9})));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].is_string());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 9);
    assert_eq!(u["total_tokens"].as_u64().unwrap(), u["prompt_tokens"].as_u64().unwrap() + 9);
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64());

    // Token-array prompts count exactly their tokens.
    let c = s.post_json("/v1/completions", &json!({"prompt": [5, 6, 7, 8, 9], "max_tokens": 3, "ignore_eos": true})).json();
    assert_eq!(c["object"], "text_completion");
    assert_eq!(c["usage"]["prompt_tokens"], 5);
    assert_eq!(c["usage"]["completion_tokens"], 3);
    assert!(c["choices"][0]["text"].is_string());

    // echo puts the prompt text in front; logprobs report each token.
    let e = s.post_json("/v1/completions", &json!({"prompt": "the model", "max_tokens": 4, "echo": true, "logprobs": 2, "ignore_eos": true})).json();
    let text = e["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("the model"), "{text}");
    let lp = &e["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    for l in lp["token_logprobs"].as_array().unwrap() {
        assert!(l.as_f64().unwrap() <= 0.0);
    }
    assert_eq!(lp["text_offset"][0], 9, "offsets count from the end of the echoed prompt");
    // mlx_lm.server's form: a flag, the count in top_logprobs.
    let f = s.post_json("/v1/completions", &json!({"prompt": "the model", "max_tokens": 3, "logprobs": true, "top_logprobs": 3, "ignore_eos": true})).json();
    let lp = &f["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3, "{f}");
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3, "{f}");
    let none = s.post_json("/v1/completions", &json!({"prompt": "the model", "max_tokens": 2, "logprobs": false})).json();
    assert!(none["choices"][0]["logprobs"].is_null(), "{none}");
    // Chat, as mlx_lm.server reads it: a count alone asks for them; -1 is none.
    let chat_lp = |extra: Value| s.post_json("/v1/chat/completions", &chat_body("the model", extra)).json()["choices"][0]["logprobs"].clone();
    let alone = chat_lp(json!({"top_logprobs": 2, "max_tokens": 3}));
    assert_eq!(alone["content"].as_array().map(Vec::len), Some(3), "{alone}");
    assert_eq!(alone["content"][0]["top_logprobs"].as_array().map(Vec::len), Some(2), "{alone}");
    let minus = chat_lp(json!({"logprobs": true, "top_logprobs": -1, "max_tokens": 3}));
    assert_eq!(minus["content"][0]["top_logprobs"], json!([]), "{minus}");
    assert!(chat_lp(json!({"top_logprobs": -1, "max_tokens": 2})).is_null());

    let models = s.get("/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["id"], model().to_str().unwrap());
    let health = s.get("/health").json();
    assert_eq!(health["status"], "ok");
    assert!(["cpu", "cuda", "metal"].contains(&health["backend"].as_str().unwrap()), "{health}");
    assert!(health["memory"]["peak_bytes"].as_u64().unwrap() > 0, "{health}");
}

#[test]
fn stop_strings_end_the_text_before_them_streamed_or_not() {
    let s = TestServer::start(&model(), &[]);
    let base = json!({"prompt": "attention value", "max_tokens": 40, "ignore_eos": true});
    let full = s.post_json("/v1/completions", &base).json()["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the greedy output (at a char boundary).
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 12, "{full:?}");
    let stop: String = chars[8..11].iter().collect();
    let cut = full.find(&stop).unwrap();
    let mut req = base.clone();
    req["stop"] = json!([stop, "never-appears"]);
    let r = s.post_json("/v1/completions", &req).json();
    assert_eq!(r["choices"][0]["text"], full[..cut]);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    req["stream"] = json!(true);
    let body = s.post_json("/v1/completions", &req).body;
    let events = sse_events(&body);
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, full[..cut], "the stream never passes the stop string");
}

#[test]
fn a_stop_string_naming_a_special_token_stops_at_that_token() {
    let s = TestServer::start(&model(), &[]);
    // Token 1 is the test tokenizer's <|im_start|>: a special token the output never shows.
    let body = json!({"prompt": "hello", "max_tokens": 8, "ignore_eos": true, "logit_bias": {"1": 100}, "stop": ["<|im_start|>"]});
    let r = s.post_json("/v1/completions", &body).json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    assert_eq!(r["choices"][0]["text"], "", "{r}");
    let mut anthropic = json!({"max_tokens": 8, "temperature": 0, "ignore_eos": true, "logit_bias": {"1": 100}, "stop_sequences": ["<|im_start|>"]});
    anthropic["messages"] = json!([{"role": "user", "content": "hello"}]);
    let r = s.post_json("/v1/messages", &anthropic).json();
    assert_eq!((&r["stop_reason"], &r["stop_sequence"]), (&json!("stop_sequence"), &json!("<|im_start|>")), "{r}");
}

#[test]
fn anthropic_stop_sequences_are_named_as_what_ended_the_message() {
    let s = TestServer::start(&model(), &[]);
    let base = json!({"max_tokens": 40, "temperature": 0, "ignore_eos": true, "messages": [{"role": "user", "content": "attention value"}]});
    let full = s.post_json("/v1/messages", &base).json();
    assert_eq!((&full["stop_reason"], &full["stop_sequence"]), (&json!("max_tokens"), &Value::Null), "{full}");
    let full = full["content"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 12, "{full:?}");
    let stop: String = chars[8..11].iter().collect();
    let cut = full.find(&stop).unwrap();
    let mut req = base.clone();
    req["stop_sequences"] = json!(["never-appears", stop]);
    let r = s.post_json("/v1/messages", &req).json();
    assert_eq!(r["content"][0]["text"], full[..cut], "{r}");
    assert_eq!((&r["stop_reason"], &r["stop_sequence"]), (&json!("stop_sequence"), &json!(stop)), "{r}");
    req["stream"] = json!(true);
    let body = s.post_json("/v1/messages", &req).body;
    let delta = body.split("\n\n").filter_map(|b| b.split_once("\ndata: ")).map(|(_, d)| serde_json::from_str::<Value>(d).unwrap()).find(|e| e["type"] == "message_delta").unwrap();
    assert_eq!((&delta["delta"]["stop_reason"], &delta["delta"]["stop_sequence"]), (&json!("stop_sequence"), &json!(stop)), "{body}");
}

#[test]
fn the_same_seed_gives_the_same_sampled_text() {
    let s = TestServer::start(&model(), &[]);
    let req = chat_body("hello", json!({"temperature": 1.0, "top_p": 0.9, "seed": 42, "max_tokens": 24}));
    let a = s.post_json("/v1/chat/completions", &req).json();
    let b = s.post_json("/v1/chat/completions", &req).json();
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    let greedy = s.post_json("/v1/chat/completions", &chat_body("hello", json!({"max_tokens": 24}))).json();
    assert_ne!(a["choices"][0]["message"]["content"], greedy["choices"][0]["message"]["content"], "temperature 1 samples");
}

/// Greedy completions of a few prompts, one request at a time.
fn prompts() -> Vec<String> {
    ["the model", "hello world cache", "attention value key query stream", "a", "token server memory", "rust python", "weight layer", "東京 café"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn complete(s: &TestServer, prompt: &str, max_tokens: usize) -> String {
    let r = s.post_json("/v1/completions", &json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn concurrent_requests_decode_as_one_batch_with_the_same_tokens_and_more_throughput() {
    let s = TestServer::start(&model(), &["--prompt-cache-bytes", "0"]);
    let n_tokens = 48;
    let run_concurrently = || -> Vec<String> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = prompts().into_iter().map(|p| scope.spawn({ let s = &s; move || complete(s, &p, n_tokens) })).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    // Untimed first: GPU backends compile kernels for each new batch shape.
    run_concurrently();
    let t = Instant::now();
    let sequential: Vec<String> = prompts().iter().map(|p| complete(&s, p, n_tokens)).collect();
    let sequential_time = t.elapsed();
    let steps_before = metric(&s, "mlx_serve_decode_steps_total");
    let rows_before = metric(&s, "mlx_serve_decode_rows_total");
    let t = Instant::now();
    let concurrent = run_concurrently();
    let concurrent_time = t.elapsed();
    assert_eq!(concurrent, sequential, "batched decoding changed the greedy output");
    let steps = metric(&s, "mlx_serve_decode_steps_total") - steps_before;
    let rows = metric(&s, "mlx_serve_decode_rows_total") - rows_before;
    eprintln!("{} rows in {steps} steps; sequential {sequential_time:?}, concurrent {concurrent_time:?}", rows);
    assert!(rows >= (prompts().len() * n_tokens) as f64);
    assert!(rows / steps > 2.0, "mean batch size {} : the requests were not batched", rows / steps);
    assert!(concurrent_time < sequential_time, "batched throughput is not above sequential");
}

#[test]
fn requests_sent_together_to_an_idle_server_share_one_prefill_call() {
    // The first request wakes the idle engine; it waits for the others the
    // HTTP layer is reading and tokenizing, so all eight prompts share a call.
    // (Without that wait the first is prefilled alone, every time.) The
    // prompts open alike, as chats open with their template's tokens: after
    // the first burst the prompt cache holds entries sharing those few
    // tokens with every later prompt, a hit too short to take a prompt out
    // of its shared call. A burst whose requests the client's threads spread
    // past the wait may split (its default, 10 ms, is raised here: the tests
    // run side by side on two cores; with a build beside them all of three
    // bursts once split): one of up to six bursts in a single call suffices.
    let mut server = std::process::Command::new(common::server::binary());
    server.env("MLX_SERVE_ARRIVAL_WAIT_MS", "200");
    let m = model();
    let s = TestServer::start_by(server, &["--model", m.to_str().unwrap(), "--prompt-concurrency", "8"]);
    let burst = |round: usize| {
        let gate = std::sync::Barrier::new(prompts().len());
        std::thread::scope(|scope| {
            for (i, p) in prompts().into_iter().enumerate() {
                let (s, gate) = (&s, &gate);
                scope.spawn(move || {
                    gate.wait();
                    complete(s, &format!("a shared opening: {p} {round} {i}"), 2)
                });
            }
        });
    };
    burst(0);
    // A gauge, published after the engine's turn: the responses may come first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&s, "mlx_serve_prompt_cache_bytes") == 0.0 {
        assert!(Instant::now() < deadline, "the first burst left nothing in the prompt cache");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut calls_a_burst = Vec::new();
    for round in 1..7 {
        let (calls, prompts_before) = (metric(&s, "mlx_serve_prefill_calls_total"), metric(&s, "mlx_serve_prefill_prompts_total"));
        burst(round);
        assert_eq!(metric(&s, "mlx_serve_prefill_prompts_total") - prompts_before, prompts().len() as f64);
        calls_a_burst.push(metric(&s, "mlx_serve_prefill_calls_total") - calls);
        if calls_a_burst.last() == Some(&1.0) {
            break;
        }
    }
    assert!(calls_a_burst.contains(&1.0), "no burst of {} requests shared one prefill call: calls a burst {calls_a_burst:?}", prompts().len());
    assert_eq!(metric(&s, "mlx_serve_prompt_cache_hits_total"), 0.0, "a few shared opening tokens were taken from the prompt cache");
    assert!(metric(&s, r#"mlx_serve_engine_seconds_total{phase="gather"}"#) > 0.0, "the engine never waited for requests on their way");
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_sequence() {
    let s = TestServer::start(&long_context_model(), &[]);
    let addr = s.base.strip_prefix("http://").unwrap().to_string();
    let body = json!({"prompt": "the model", "max_tokens": 100000, "ignore_eos": true, "stream": true}).to_string();
    let mut conn = TcpStream::connect(&addr).unwrap();
    write!(conn, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut buf = [0u8; 4096];
    let mut seen = String::new();
    while !seen.contains("data: {") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let running = |s: &TestServer| s.get("/health").json()["engine"]["running"].as_u64().unwrap();
    assert_eq!(running(&s), 1);
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(30);
    while running(&s) != 0 || metric(&s, "mlx_serve_cancelled_total") < 1.0 {
        assert!(Instant::now() < deadline, "the sequence kept running after its client left");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.get("/health").json()["engine"]["kv_cache_bytes"], 0);
    // And the server still serves.
    assert!(!complete(&s, "hello", 3).is_empty());
}

#[test]
fn the_prompt_cache_reuses_a_conversation_prefix_without_changing_the_answer() {
    let cached = TestServer::start(&model(), &[]);
    let plain = TestServer::start(&model(), &["--prompt-cache-bytes", "0"]);
    let system = "the model token server memory cache layer weight attention value key query stream ".repeat(6);
    let turn1 = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}], "max_tokens": 12, "ignore_eos": true});
    let a1 = cached.post_json("/v1/chat/completions", &turn1).json();
    assert_eq!(a1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let reply = a1["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let turn2 = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": reply}, {"role": "user", "content": "and then"}],
                       "max_tokens": 12, "ignore_eos": true});
    let a2 = cached.post_json("/v1/chat/completions", &turn2).json();
    let hit = a2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = a2["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(hit > 100 && hit < prompt, "cached {hit} of {prompt}");
    let b2 = plain.post_json("/v1/chat/completions", &turn2).json();
    assert_eq!(a2["choices"][0]["message"]["content"], b2["choices"][0]["message"]["content"]);
    assert_eq!(b2["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let m = cached.metrics();
    assert_eq!(counter_value(&m, "mlx_serve_prompt_cache_hits_total"), Some(1.0));
    assert_eq!(counter_value(&m, "mlx_serve_prompt_cache_tokens_total"), Some(hit as f64));
    assert!(counter_value(&m, "mlx_serve_prompt_cache_bytes").unwrap() > 0.0);
}

#[test]
fn with_a_quantized_kv_cache_the_prompt_cache_keeps_quantized_prefixes() {
    let s = TestServer::start(&quantizable_kv_model(), &["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "0"]);
    let system = "the model token server memory cache layer weight attention value key query stream ".repeat(6);
    let turn1 = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}], "max_tokens": 12, "ignore_eos": true});
    let a = s.post_json("/v1/chat/completions", &turn1).json();
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // The same prompt again reuses all but its last token. Each token's keys and
    // values are quantized on their own (groups run along the head dimension), so
    // the restored prefix holds exactly what the first request computed and the
    // greedy answer cannot change.
    let b = s.post_json("/v1/chat/completions", &turn1).json();
    let prompt = b["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(prompt - 1));
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    // A next turn extends the cached (quantized) conversation.
    let reply = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let turn2 = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": reply}, {"role": "user", "content": "and then"}],
                       "max_tokens": 12, "ignore_eos": true});
    let c = s.post_json("/v1/chat/completions", &turn2).json();
    let hit = c["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(hit > 100, "cached {hit}");
    assert_eq!(c["usage"]["completion_tokens"], 12);
    assert_eq!(metric(&s, "mlx_serve_prompt_cache_hits_total"), 2.0);
}

#[test]
fn metrics_count_requests_tokens_and_latencies() {
    let started = Instant::now();
    let s = TestServer::start(&model(), &[]);
    s.post_json("/v1/completions", &json!({"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": true}));
    s.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 0}));
    s.get("/v1/models");
    let m = s.metrics();
    assert_eq!(counter_value(&m, r#"mlx_serve_requests_total{endpoint="/v1/completions",status="200"}"#), Some(1.0));
    assert_eq!(counter_value(&m, r#"mlx_serve_requests_total{endpoint="/v1/completions",status="400"}"#), Some(1.0));
    assert_eq!(counter_value(&m, r#"mlx_serve_requests_total{endpoint="/v1/models",status="200"}"#), Some(1.0));
    assert_eq!(counter_value(&m, "mlx_serve_prompt_tokens_total"), Some(3.0));
    assert_eq!(counter_value(&m, "mlx_serve_generated_tokens_total"), Some(5.0));
    assert_eq!(counter_value(&m, "mlx_serve_time_to_first_token_seconds_count"), Some(1.0));
    assert_eq!(counter_value(&m, "mlx_serve_inter_token_seconds_count"), Some(4.0));
    // The engine thread's time by part of its turns: every part ran (the prompt's
    // first two tokens were prefilled, the sequence joined, five tokens were decoded
    // and handed over), and one thread cannot have spent more than the wall clock.
    let parts = ["admit", "decode", "tokens", "join", "prefill"];
    let seconds: Vec<f64> = parts.iter().map(|p| counter_value(&m, &format!(r#"mlx_serve_engine_seconds_total{{phase="{p}"}}"#)).unwrap_or(0.0)).collect();
    for (part, &t) in parts.iter().zip(&seconds) {
        assert!(t > 0.0, "no engine time recorded for {part}: {seconds:?}");
    }
    assert!(seconds.iter().sum::<f64>() <= started.elapsed().as_secs_f64(), "engine parts {seconds:?} add up to more than the wall clock");
    // The decode steps' host time split by what the host did: each part ran (a
    // graph built, launched, its tokens waited for), and within the decode part.
    let host: Vec<f64> =
        ["build", "launch", "wait"].iter().map(|p| counter_value(&m, &format!(r#"mlx_serve_decode_host_seconds_total{{phase="{p}"}}"#)).unwrap_or(0.0)).collect();
    assert!(host.iter().all(|&t| t > 0.0), "decode host time by part: {host:?}");
    assert!(host.iter().sum::<f64>() <= seconds[1], "decode host parts {host:?} add up to more than the decode part ({})", seconds[1]);
    // A gauge, published after the engine's turn: the response may come first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter_value(&s.metrics(), "mlx_serve_running_sequences") != Some(0.0) {
        assert!(Instant::now() < deadline, "running_sequences never went back to 0");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    let s = TestServer::start(&model(), &["--max-body-bytes", "4096"]);
    let chat = "/v1/chat/completions";
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        (chat, "{not json".into(), 400, None),
        (chat, "".into(), 400, None),
        (chat, "[1, 2]".into(), 400, None),
        (chat, json!({"messages": "hi"}).to_string(), 400, Some("messages")),
        (chat, json!({"messages": []}).to_string(), 400, Some("messages")),
        (chat, json!({}).to_string(), 400, None),
        (chat, json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        (chat, json!({"messages": [{"content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        (chat, json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).to_string(), 400, Some("messages[0].content[0].type")),
        (chat, chat_body("x", json!({"temperature": "hot"})).to_string(), 400, Some("temperature")),
        (chat, chat_body("x", json!({"temperature": -1})).to_string(), 400, Some("temperature")),
        (chat, chat_body("x", json!({"top_p": 1.5})).to_string(), 400, Some("top_p")),
        (chat, chat_body("x", json!({"top_k": -3})).to_string(), 400, Some("top_k")),
        (chat, chat_body("x", json!({"presence_penalty": 9})).to_string(), 400, Some("presence_penalty")),
        (chat, chat_body("x", json!({"xtc_probability": 0.5, "xtc_threshold": 0.7})).to_string(), 400, Some("xtc_threshold")),
        (chat, chat_body("x", json!({"max_tokens": 0})).to_string(), 400, Some("max_tokens")),
        (chat, chat_body("x", json!({"max_tokens": 5000})).to_string(), 400, Some("max_tokens")),
        (chat, chat_body("x", json!({"n": 3})).to_string(), 400, Some("n")),
        (chat, chat_body("x", json!({"logit_bias": {"999999": 1}})).to_string(), 400, Some("logit_bias")),
        (chat, chat_body("x", json!({"logprobs": true, "top_logprobs": 50})).to_string(), 400, Some("top_logprobs")),
        (chat, chat_body("x", json!({"stop": 7})).to_string(), 400, Some("stop")),
        (chat, chat_body("x", json!({"model": "gpt-4"})).to_string(), 404, Some("model")),
        (chat, format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}", "x".repeat(5000)), 413, None),
        ("/v1/completions", json!({"prompt": ""}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": [1, 100000]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": [-1]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": ["a", "b"]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": {"a": 1}}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": "x", "logprobs": 99}).to_string(), 400, Some("logprobs")),
        ("/v1/completions", json!({"prompt": "x", "logprobs": true, "top_logprobs": 99}).to_string(), 400, Some("top_logprobs")),
        ("/v1/completions", json!({"prompt": "x", "logprobs": "x"}).to_string(), 400, Some("logprobs")),
        ("/v1/nothing", "{}".into(), 404, None),
    ];
    for (path, body, status, param) in cases {
        let r = s.post(path, &body);
        assert_eq!(r.status, status, "{path} {body:.200}: {}", r.body);
        let e = r.json();
        let err = &e["error"];
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", r.body);
        assert!(err["type"].is_string() && err.get("param").is_some() && err.get("code").is_some(), "{}", r.body);
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{body:.200}: {}", r.body);
        }
    }
    // Both numbers appear when prompt + max_tokens exceed the context.
    let r = s.post_json(chat, &chat_body("x", json!({"max_tokens": 5000})));
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("2048") && msg.contains("5000"), "{msg}");
    // The server still answers after all of that.
    assert_eq!(s.post_json(chat, &chat_body("x", json!({"max_tokens": 2}))).status, 200);
}

#[test]
fn an_api_key_is_required_when_set() {
    let s = TestServer::start(&model(), &["--api-key", "sekrit"]);
    let body = chat_body("x", json!({"max_tokens": 2})).to_string();
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    assert_eq!(s.post_with_header("/v1/chat/completions", &body, ("Authorization", "Bearer wrong")).status, 401);
    assert_eq!(s.get("/v1/models").status, 401);
    assert_eq!(s.post_with_header("/v1/chat/completions", &body, ("Authorization", "Bearer sekrit")).status, 200);
    assert_eq!(s.get_with_header("/v1/models", ("Authorization", "Bearer sekrit")).status, 200);
}

#[test]
fn a_full_queue_answers_503_with_retry_after_and_a_queued_client_that_leaves_frees_its_place() {
    let s = TestServer::start(&long_context_model(), &["--max-concurrency", "1", "--max-queue", "1"]);
    let long = json!({"prompt": "the model", "max_tokens": 100000, "ignore_eos": true, "stream": true}).to_string();
    let addr = s.base.strip_prefix("http://").unwrap().to_string();
    // Two held streams: one running, one queued behind it.
    let open = |body: &str| {
        let mut c = TcpStream::connect(&addr).unwrap();
        write!(c, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        c
    };
    let _running = open(&long);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.get("/health").json()["engine"]["running"] != 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let queued = open(&long);
    let queued_now = |n: u64| {
        while s.get("/health").json()["engine"]["queued"] != n {
            assert!(Instant::now() < deadline, "the queue never held {n}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    queued_now(1);
    let r = s.post("/v1/completions", &long);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(r.json()["error"]["type"], "server_error");
    // A queued client that leaves frees its place while every slot stays
    // busy: the next request is queued, not refused.
    drop(queued);
    queued_now(0);
    let _next = open(&long);
    queued_now(1);
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut s = TestServer::start(&model(), &[]);
    assert_eq!(s.get("/health").status, 200);
    let killed = std::process::Command::new("kill").args(["-TERM", &s.pid().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = s.wait_exit(Duration::from_secs(20)).expect("the server did not exit on SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[test]
fn the_official_openai_client_works_against_the_server() {
    let s = TestServer::start(&model(), &["--tool-call-parser", "hermes"]);
    let out = std::process::Command::new(common::python())
        .arg(common::repo().join("server/tests/openai_client.py"))
        .arg(format!("{}/v1", s.base))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "openai client failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("openai client: all checks passed"), "{stdout}");
}

/// A ChatML template that lists the tools and asks for Hermes calls (the test
/// model's own template shows no tools), written into `dir`.
#[test]
fn history_messages_reach_the_template_with_their_other_fields_as_mlx_lm_sends_them() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("reasoning.jinja");
    std::fs::write(&template, "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}{{ m.content }}\n{% endfor %}").unwrap();
    let s = TestServer::start(&model(), &["--chat-template", template.to_str().unwrap()]);
    let render = |messages: Value| s.post_json("/tokenize", &json!({"messages": messages, "add_special_tokens": false})).json();
    let plain = render(json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]));
    // A thinking model's earlier reasoning, sent back in the history, is rendered.
    let with_reasoning = render(json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "reasoning_content": "greet back"}, {"role": "user", "content": "again"}]));
    assert!(with_reasoning["count"].as_u64() > plain["count"].as_u64(), "{with_reasoning} vs {plain}");
    // Null content (mlx_lm.server answers an empty reply so) and Llama 3.1's ipython role are read, not refused.
    let r = s.post_json("/v1/chat/completions", &chat_body("x", json!({"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": null}, {"role": "ipython", "content": "42"}, {"role": "user"}]})));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_model_without_a_chat_template_chats_in_mlx_lms_plain_transcript() {
    let dir = common::copy_of(&model(), "server_api_no_template", "model");
    let config_path = dir.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let _ = std::fs::remove_file(dir.join("chat_template.jinja"));
    let s = TestServer::start(&dir, &[]);
    let messages = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
    // mlx_lm.server's convert_chat, encoded with the special tokens added.
    let expected = s.post_json("/tokenize", &json!({"prompt": "ASSISTANT's RULE: be brief\nUSER: hi\nASSISTANT:", "add_special_tokens": true})).json();
    assert_eq!(s.post_json("/tokenize", &json!({"messages": messages})).json()["tokens"], expected["tokens"]);
    let r = s.post_json("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 3, "ignore_eos": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens"], expected["count"]);
    let health = s.get("/health").json();
    assert_eq!((&health["capabilities"]["chat_completions"], &health["capabilities"]["chat_template"]), (&json!(true), &json!(false)), "{health}");
}

/// mlx_lm.server's command lines start this server: its sampling defaults
/// and template variables act, its other names of our flags are read, and
/// flags that would change the answers are refused.
#[test]
fn mlx_lm_server_flags_start_the_server_and_act() {
    let template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is defined and not enable_thinking %} no-think{% endif %}";
    let flags = ["--temp", "2.0", "--top-p", "1.0", "--top-k", "0", "--min-p", "0.0", "--prefill-step-size", "64", "--decode-concurrency", "4",
                 "--allowed-origins", "http://localhost:3000", "--trust-remote-code", "--prompt-cache-size", "10",
                 "--chat-template-args", r#"{"enable_thinking": false}"#, "--chat-template", template];
    let s = TestServer::start(&model(), &flags);
    let tokens = |kwargs: Value| s.post_json("/tokenize", &json!({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": kwargs})).json()["count"].as_u64().unwrap();
    // The default variable renders " no-think"; a request's own value overrides it.
    assert!(tokens(json!({})) > tokens(json!({"enable_thinking": true})));
    // --temp 2 samples unless the request asks for greedy.
    let body = |extra: Value| chat_body("the model", extra);
    let greedy = s.post_json("/v1/chat/completions", &body(json!({"temperature": 0}))).json()["choices"][0]["message"]["content"].clone();
    let sampled = s.post_json("/v1/chat/completions", &body(json!({"seed": 3}))).json()["choices"][0]["message"]["content"].clone();
    assert_ne!(sampled, greedy, "--temp 2 did not apply");
    for (flags, expected) in [
        (vec!["--adapter-path", "x"], "--adapter-path"),
        (vec!["--draft-model", "x"], "--draft-model"),
        (vec!["--top-p", "1.5"], "top_p"),
        (vec!["--chat-template", "no-such-file.jinja"], "names no file"),
        (vec!["--chat-template-args", "[1]"], "JSON object"),
    ] {
        let err = common::server::refused_start(&model(), &flags);
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
}

fn tools_template(dir: &std::path::Path) -> std::path::PathBuf {
    let template = dir.join("tools.jinja");
    std::fs::write(
        &template,
        "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools> answer with <tool_call>{json}</tool_call>\n{% endif %}\
         {% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    template
}

#[test]
fn tools_reach_the_chat_template_and_the_tool_call_format_is_recognised() {
    let dir = tempfile::tempdir().unwrap();
    let template = tools_template(dir.path());
    let s = TestServer::start(&model(), &["--chat-template", template.to_str().unwrap()]);
    assert_eq!(s.get("/health").json()["capabilities"]["tools"], "hermes");
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let prompt_tokens = |extra: Value| {
        let r = s.post_json("/v1/chat/completions", &chat_body("weather?", extra));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let plain = prompt_tokens(json!({"max_tokens": 1}));
    assert!(prompt_tokens(json!({"max_tokens": 1, "tools": tools})) > plain + 5);
    assert_eq!(prompt_tokens(json!({"max_tokens": 1, "tools": tools, "tool_choice": "none"})), plain);
    // The Responses API's flat tool shape renders as the nested one.
    let flat = json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]);
    assert_eq!(prompt_tokens(json!({"max_tokens": 1, "tools": flat})), prompt_tokens(json!({"max_tokens": 1, "tools": tools})));
    let bad = s.post_json("/v1/chat/completions", &chat_body("x", json!({"tools": [{"type": "function"}]})));
    assert_eq!((bad.status, bad.json()["error"]["param"].as_str()), (400, Some("tools[0]")));

    // The flag overrides what the template shows; an unknown name stops the start.
    let m = TestServer::start(&model(), &["--tool-call-parser", "mistral"]);
    assert_eq!(m.get("/health").json()["capabilities"]["tools"], "mistral");
    // Mistral's markers are special tokens: with tools, special tokens stay in the text
    // the parser reads (forced here with logit_bias on <|im_start|>, id 1); without, they go.
    let forced = |extra: Value| {
        let mut body = chat_body("x", json!({"max_tokens": 3, "logit_bias": {"1": 100}}));
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        m.post_json("/v1/chat/completions", &body).json()["choices"][0]["message"]["content"].clone()
    };
    assert_eq!(forced(json!({"tools": tools})), "<|im_start|><|im_start|><|im_start|>");
    assert_eq!(forced(json!({})), "");
    let out = std::process::Command::new(common::server::binary())
        .args(["--model", model().to_str().unwrap(), "--port", "0", "--tool-call-parser", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("hermes, llama3_json, mistral"));
}

/// /health once no sequence runs (the engine publishes its figures after its turn).
fn idle_health(s: &TestServer) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = s.get("/health").json();
        if h["engine"]["running"] == 0 {
            return h;
        }
        assert!(Instant::now() < deadline, "the engine did not go idle");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn finished_sequences_leave_only_their_prompt_cache_entries_in_memory() {
    let s = TestServer::start(&long_context_model(), &[]);
    let idle = |s: &TestServer| -> (i64, i64) {
        let h = idle_health(s);
        (h["memory"]["active_bytes"].as_i64().unwrap(), h["engine"]["prompt_cache_bytes"].as_i64().unwrap())
    };
    complete(&s, "warm up the weights", 8);
    let (active0, cached0) = idle(&s);
    std::thread::scope(|scope| {
        for p in prompts() {
            let s = &s;
            scope.spawn(move || complete(s, &p, 200));
        }
    });
    let (active1, cached1) = idle(&s);
    assert!(cached1 > cached0, "the finished sequences went into the prompt cache");
    // What stays is the weights and the prompt cache's own (counted) bytes: no
    // batch buffers kept alive behind the entries.
    let leftover = (active1 - cached1) - (active0 - cached0);
    assert!(leftover.abs() < 256 * 1024, "{leftover} bytes beyond the prompt cache stayed allocated");
}

#[test]
fn sigusr1_resets_the_mlx_peak_memory_that_health_and_metrics_report() {
    let s = TestServer::start(&model(), &[]);
    let idle_memory = |s: &TestServer| -> (i64, i64) {
        let h = idle_health(s);
        (h["memory"]["active_bytes"].as_i64().unwrap(), h["memory"]["peak_bytes"].as_i64().unwrap())
    };
    complete(&s, "fill the caches with something", 32);
    let (active, peak) = idle_memory(&s);
    assert!(peak > active, "generation's temporaries raised the peak ({peak}) above what stays live ({active})");
    assert_eq!(metric(&s, "mlx_serve_mlx_peak_memory_bytes"), peak as f64);
    assert_eq!(metric(&s, "mlx_serve_mlx_active_memory_bytes"), active as f64);

    let sent = std::process::Command::new("kill").args(["-USR1", &s.pid().to_string()]).status().unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while idle_memory(&s).1 != active {
        assert!(Instant::now() < deadline, "the peak did not drop to the live memory after SIGUSR1");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(&s, "mlx_serve_mlx_peak_memory_bytes"), active as f64, "/metrics shows the reset too");
    assert_eq!(s.get("/health").status, 200, "the server keeps serving after the signal");

    complete(&s, "and generate again to raise it", 32);
    let (active2, peak2) = idle_memory(&s);
    assert!(peak2 > active2, "the next generation raises the peak again");
}

#[test]
fn a_document_asked_again_and_again_keeps_one_prompt_cache_entry() {
    let s = TestServer::start(&model(), &[]);
    let document = "the model token server memory cache layer weight attention value key query stream ".repeat(8);
    let mut cache_bytes = Vec::new();
    for question in ["what first?", "what next?", "and then?"] {
        let body = json!({"messages": [{"role": "system", "content": document}, {"role": "user", "content": question}],
                          "max_tokens": 8, "ignore_eos": true});
        assert_eq!(s.post_json("/v1/chat/completions", &body).status, 200);
        cache_bytes.push(idle_health(&s)["engine"]["prompt_cache_bytes"].as_i64().unwrap());
    }
    // Each answer's entry replaces the one its request started from: the cache holds one
    // document's KV (give or take the question and answer), not one per question.
    let entry = cache_bytes[0];
    assert!(entry > 0);
    for b in &cache_bytes[1..] {
        assert!((b - entry).abs() < entry / 4, "prompt cache bytes per question: {cache_bytes:?}");
    }
    assert_eq!(metric(&s, "mlx_serve_prompt_cache_hits_total"), 2.0);
}

#[test]
fn a_request_sharing_only_the_template_start_does_not_replace_another_documents_entry() {
    let s = TestServer::start(&model(), &[]);
    let ask = |document: &str, question: &str| -> u64 {
        let body = json!({"messages": [{"role": "system", "content": document}, {"role": "user", "content": question}],
                          "max_tokens": 8, "ignore_eos": true});
        let r = s.post_json("/v1/chat/completions", &body).json();
        r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    let a = "alpha model token server memory cache layer weight attention ".repeat(8);
    let b = "bravo value key query stream expert quantize metal cuda apple ".repeat(8);
    ask(&a, "what first?");
    assert!(ask(&b, "what first?") < 10, "b shares only the chat template's first tokens with a");
    assert!(ask(&a, "what next?") > 100, "a's entry is still there");
}

#[test]
fn served_model_names_and_aliases_are_accepted_and_other_names_get_404_listing_them() {
    let dir = model();
    let s = TestServer::start(&dir, &["--served-model-name", "tiny,gpt-4o-mini"]);
    let path = dir.to_str().unwrap();
    let base = dir.file_name().unwrap().to_str().unwrap();
    let models = s.get("/v1/models").json();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tiny", "gpt-4o-mini", path, base], "{models}");
    for name in ["tiny", "gpt-4o-mini", path, base, "default_model"] {
        let r = s.post_json("/v1/completions", &json!({"model": name, "prompt": "hi", "max_tokens": 2}));
        assert_eq!(r.status, 200, "{name}: {}", r.body);
        assert_eq!(r.json()["model"], "tiny", "responses name the served id");
    }
    assert_eq!(s.get("/v1/models/gpt-4o-mini").status, 200);
    let r = s.post_json("/v1/chat/completions", &chat_body("hi", json!({"model": "llama-3"})));
    assert_eq!(r.status, 404, "{}", r.body);
    let e = &r.json()["error"];
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(e["param"], "model");
    for name in ["`llama-3`", "`tiny`", "`gpt-4o-mini`", &format!("`{base}`")] {
        assert!(e["message"].as_str().unwrap().contains(name), "the 404 should name {name}: {e}");
    }
}

#[test]
fn tokenize_and_detokenize_answer_in_vllm_and_llama_cpp_shapes() {
    let dir = model();
    let s = TestServer::start(&dir, &[]);
    let tok = mlx_serve::tokenizer::Tokenizer::load(&dir, None).unwrap();
    let text = "hello model, the cache";

    // vLLM: {"prompt"} → tokens, count, max_model_len.
    let v = s.post_json("/tokenize", &json!({"prompt": text})).json();
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(v["tokens"], json!(ids), "{v}");
    assert_eq!(v["count"], ids.len());
    assert!(v["max_model_len"].as_u64().is_some(), "{v}");
    // llama.cpp: {"content", "add_special": false, "with_pieces"} → [{id, piece}].
    let v = s.post_json("/tokenize", &json!({"content": text, "add_special": false, "with_pieces": true})).json();
    let plain = tok.encode(text, false).unwrap();
    let got: Vec<u64> = v["tokens"].as_array().unwrap().iter().map(|t| t["id"].as_u64().unwrap()).collect();
    assert_eq!(got, plain.iter().map(|&i| i as u64).collect::<Vec<_>>());
    let pieces: String = v["tokens"].as_array().unwrap().iter().map(|t| t["piece"].as_str().unwrap()).collect();
    assert_eq!(pieces, tok.decode(&plain, false).unwrap(), "the pieces spell the text");

    // Chat messages: the ids a chat completion prefills.
    let msgs = json!([{"role": "user", "content": text}]);
    let v = s.post_json("/tokenize", &json!({"messages": msgs})).json();
    assert_eq!(v["tokens"], json!(tok.encode_chat(&msgs, None).unwrap()));
    let chat = s.post_json("/v1/chat/completions", &json!({"messages": msgs, "max_tokens": 1})).json();
    assert_eq!(chat["usage"]["prompt_tokens"], v["count"], "{chat}");
    let without = s.post_json("/tokenize", &json!({"messages": msgs, "add_generation_prompt": false})).json();
    let (with_ids, without_ids) = (v["tokens"].as_array().unwrap(), without["tokens"].as_array().unwrap());
    assert!(without_ids.len() < with_ids.len() && with_ids.starts_with(without_ids), "{without} vs {v}");

    // Back: vLLM reads `prompt`, llama.cpp `content`.
    let d = s.post_json("/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(d["prompt"], tok.decode(&ids, false).unwrap());
    assert_eq!(d["content"], d["prompt"]);

    // Bad input: 400 naming the field, 404 for another model.
    let vocab = tok.inner().get_vocab_size(true);
    for (path, body, param) in [
        ("/detokenize", json!({"tokens": [5, -1]}), "tokens[1]"),
        ("/detokenize", json!({"tokens": [vocab + 10]}), "tokens[0]"),
        ("/detokenize", json!({}), "tokens"),
        ("/tokenize", json!({}), "prompt"),
        ("/tokenize", json!({"prompt": "a", "messages": msgs}), "messages"),
        ("/tokenize", json!({"prompt": 5}), "prompt"),
        ("/tokenize", json!({"messages": msgs, "add_special_tokens": true}), "add_special_tokens"),
    ] {
        let r = s.post_json(path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{path} {body}: {}", r.body);
    }
    assert_eq!(s.post_json("/tokenize", &json!({"prompt": "a", "model": "other"})).status, 404);
}

#[test]
fn a_thinking_template_splits_reasoning_out_and_chat_template_kwargs_reach_it() {
    let dir = common::copy_of(&model(), "server_api", "thinking");
    std::fs::write(dir.join("chat_template.jinja"), THINKING_TEMPLATE).unwrap();
    let s = TestServer::start(&dir, &[]);
    // The prompt ends inside <think> and the random model never closes it:
    // everything it writes is reasoning.
    let r = s.post_json("/v1/chat/completions", &chat_body("2+2?", json!({"max_tokens": 12})));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let msg = &v["choices"][0]["message"];
    let thought = msg["reasoning_content"].as_str().unwrap_or_else(|| panic!("no reasoning_content: {v}"));
    assert!(!thought.is_empty(), "{v}");
    assert_eq!(msg["reasoning"], msg["reasoning_content"]);
    assert_eq!(msg["content"], "", "{v}");
    // Streamed: the same reasoning, as deltas.
    let streamed = s.post_json("/v1/chat/completions", &chat_body("2+2?", json!({"max_tokens": 12, "stream": true})));
    let events = sse_events(&streamed.body);
    let deltas: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["delta"].clone()).collect();
    let joined: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
    assert_eq!(joined, thought);
    assert!(deltas.iter().all(|d| d["content"].as_str().unwrap_or("").is_empty()), "{}", streamed.body);

    // enable_thinking false closes the block in the prompt: all answer.
    let off = json!({"max_tokens": 12, "chat_template_kwargs": {"enable_thinking": false}});
    let v = s.post_json("/v1/chat/completions", &chat_body("2+2?", off.clone())).json();
    let msg = &v["choices"][0]["message"];
    assert!(msg.get("reasoning_content").is_none(), "{v}");
    assert!(!msg["content"].as_str().unwrap().is_empty(), "{v}");
    // /tokenize renders the same prompts.
    let msgs = json!([{"role": "user", "content": "2+2?"}]);
    let on_ids = s.post_json("/tokenize", &json!({"messages": msgs})).json();
    let off_ids = s.post_json("/tokenize", &json!({"messages": msgs, "chat_template_kwargs": {"enable_thinking": false}})).json();
    assert!(off_ids["count"].as_u64() > on_ids["count"].as_u64(), "{off_ids} vs {on_ids}");
    assert_eq!(v["usage"]["prompt_tokens"], off_ids["count"]);

    let r = s.post_json("/v1/chat/completions", &chat_body("2+2?", json!({"chat_template_kwargs": 5})));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "chat_template_kwargs");
}

#[test]
fn the_official_anthropic_client_works_against_the_messages_endpoint() {
    // A template that shows tools (the test model's own does not).
    let dir = tempfile::tempdir().unwrap();
    let template = tools_template(dir.path());
    let flags = ["--api-key", "k", "--prompt-cache-bytes", "0", "--chat-template", template.to_str().unwrap()];
    let s = TestServer::start(&model(), &flags);
    let out = std::process::Command::new(common::python())
        .arg(common::repo().join("server/tests/anthropic_client.py"))
        .arg(&s.base)
        .arg("k")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "anthropic client failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("anthropic client: all checks passed"), "{stdout}");
}

#[test]
fn anthropic_routes_answer_anthropic_errors_and_the_stream_is_named_events() {
    let s = TestServer::start(&model(), &[]);
    let r = s.post_json("/v1/messages", &json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json(), json!({"type": "error", "error": {"type": "invalid_request_error", "message": "`max_tokens` is required"}}));
    let r = s.post("/v1/messages", "not json");
    assert_eq!(r.json()["type"], "error", "{}", r.body);
    let body = json!({"max_tokens": 3, "temperature": 0, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = s.post_json("/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.content_type.starts_with("text/event-stream"));
    assert!(r.body.starts_with("event: message_start\ndata: {"), "{}", r.body);
    assert!(r.body.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{}", r.body);
    assert!(!r.body.contains("[DONE]"));
    for block in r.body.trim_end().split("\n\n") {
        let (event, data) = block.split_once('\n').unwrap();
        let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(event.strip_prefix("event: ").unwrap(), data["type"], "{block}");
    }
}

/// The `prompt_progress` objects of a stream's chunks, and the index of the
/// first chunk carrying text.
fn progress_of(body: &str) -> (Vec<Value>, Option<usize>, Vec<Value>) {
    let events = sse_events(body);
    let chunks: Vec<Value> = events.iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect();
    let progress: Vec<Value> = chunks.iter().filter_map(|c| c.get("prompt_progress").cloned()).collect();
    let first_text = chunks.iter().position(|c| {
        let choice = &c["choices"][0];
        choice["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()) || choice["text"].as_str().is_some_and(|t| !t.is_empty())
    });
    (progress, first_text, chunks)
}

#[test]
fn streams_that_ask_report_prefill_progress_chunk_by_chunk() {
    // Chunks of 16 tokens: a ~100-token prompt is read in several.
    let s = TestServer::start(&model(), &["--prefill-size", "16"]);
    let system = "the model token server memory cache layer weight attention value key query stream ".repeat(5);
    let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}],
                      "max_tokens": 4, "ignore_eos": true, "stream": true, "return_progress": true,
                      "stream_options": {"include_usage": true}});
    let r = s.post_json("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let (progress, first_text, chunks) = progress_of(&r.body);
    let total = chunks.last().unwrap()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(total > 64, "the prompt has {total} tokens");
    // One report a chunk (the last prompt token is the first decode step's), rising to the whole prompt.
    assert_eq!(progress.len() as u64, (total - 1).div_ceil(16), "{progress:?}");
    let processed: Vec<u64> = progress.iter().map(|p| p["processed"].as_u64().unwrap()).collect();
    assert!(processed.windows(2).all(|w| w[0] < w[1]), "{processed:?}");
    assert_eq!(processed[0], 16);
    assert_eq!(*processed.last().unwrap(), total);
    for p in &progress {
        assert_eq!((p["total"].as_u64(), p["cache"].as_u64()), (Some(total), Some(0)), "{p}");
        assert!(p["time_ms"].is_u64(), "{p}");
    }
    // Progress comes before the answer, in chunks whose choice is empty.
    let last_progress = chunks.iter().rposition(|c| c.get("prompt_progress").is_some()).unwrap();
    assert!(first_text.is_some_and(|t| t > last_progress));
    let c = &chunks[last_progress];
    assert_eq!((c["object"].as_str(), &c["choices"][0]["delta"], &c["choices"][0]["finish_reason"]), (Some("chat.completion.chunk"), &json!({}), &Value::Null));

    // The same prompt again: most of it comes from the prompt cache, which the report says.
    let (progress, _, _) = progress_of(&s.post_json("/v1/chat/completions", &body).body);
    let cached = progress[0]["cache"].as_u64().unwrap();
    assert!(cached > 64, "{progress:?}");
    assert_eq!(progress.last().unwrap()["processed"].as_u64(), Some(total));

    // Text completions carry it too; without return_progress, no stream does.
    let completion = json!({"prompt": system, "max_tokens": 2, "stream": true, "return_progress": true, "ignore_eos": true});
    let (progress, _, chunks) = progress_of(&s.post_json("/v1/completions", &completion).body);
    assert!(progress.len() > 1 && chunks.iter().all(|c| c["object"] == "text_completion"), "{progress:?}");
    let plain = json!({"prompt": system, "max_tokens": 2, "stream": true});
    assert!(progress_of(&s.post_json("/v1/completions", &plain).body).0.is_empty());
    assert!(!s.post_json("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true})).body.contains("prompt_progress"));
}

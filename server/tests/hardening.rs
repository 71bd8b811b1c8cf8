//! The server as a hostile or careless client meets it (issue 20): each case
//! against a real `mlx-serve` process on the tiny test models.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::models::{long_context_model, model, model_with_context};
use common::server::{binary, TestServer};
use mlx_serve::metrics::counter_value;
use serde_json::{json, Value};

fn metric(server: &TestServer, name: &str) -> f64 {
    counter_value(&server.metrics(), name).unwrap_or(0.0)
}

fn engine(s: &TestServer) -> Value {
    s.get("/health").json()["engine"].clone()
}

/// Waits (bounded) until the engine runs `n` sequences.
fn wait_running(s: &TestServer, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine(s)["running"].as_u64() != Some(n) {
        assert!(Instant::now() < deadline, "the engine never ran {n} sequences: {}", engine(s));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything the peer sends until it closes (bounded by `within`).
fn read_to_close(c: &mut TcpStream, within: Duration) -> String {
    c.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("the connection stayed open past {within:?}; got {:?}", String::from_utf8_lossy(&out))
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{e}"),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs `mlx-serve` expecting it to refuse to start; its stderr.
fn start_failure(model: &Path, extra: &[&str]) -> String {
    let mut child = Command::new(binary())
        .args(["--model", model.to_str().unwrap(), "--port", "0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started (or hung) instead of refusing {extra:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_client_that_disconnects_before_a_whole_answer_frees_its_sequence() {
    let s = TestServer::start(&long_context_model(), &[]);
    let body = json!({"prompt": "the model", "max_tokens": 1_000_000, "ignore_eos": true}).to_string();
    let conn = s.send_raw_post("/v1/completions", &body);
    wait_running(&s, 1);
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine(&s)["running"] != 0 || metric(&s, "mlx_serve_cancelled_total") < 1.0 {
        assert!(Instant::now() < deadline, "the sequence kept generating after its client left");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(engine(&s)["kv_cache_bytes"], 0);
}

/// ~`bytes` of plain words.
fn text_of(bytes: usize) -> String {
    let words = ["the", "model", "token", "server", "memory", "cache", "layer", "weight", "attention", "value"];
    let mut text = String::with_capacity(bytes + 16);
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(words[i % words.len()]);
        text.push(' ');
        i += 7;
    }
    text
}

#[test]
fn a_prompt_far_beyond_the_context_is_refused_before_tokenizing() {
    let s = TestServer::start(&model(), &[]);
    let peak_before = s.proc_status_kib("VmHWM");
    // 15 MB of text: tokenizing it peaked at 1.4 GB before it was refused.
    let text = text_of(15 << 20);
    let r = s.post_json("/v1/completions", &json!({"prompt": text, "max_tokens": 4}));
    assert_eq!(r.status, 400, "{:.300}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["param"], "prompt");
    assert!(e["error"]["message"].as_str().unwrap().contains("maximum context length is 2048 tokens"), "{e}");
    let r = s.post_json("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": text}], "max_tokens": 4}));
    assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("messages")), "{:.300}", r.body);
    // The body (15 MB) and its parsed copy are all the memory it took.
    let grew_mib = (s.proc_status_kib("VmHWM") - peak_before) >> 10;
    assert!(grew_mib < 200, "the peak resident size grew by {grew_mib} MiB");
    // A prompt that fits is still served.
    assert_eq!(s.post_json("/v1/completions", &json!({"prompt": text_of(2000), "max_tokens": 2})).status, 200);
}

#[test]
fn the_memory_of_tokenizing_a_huge_prompt_goes_back_to_the_system() {
    // A context (400k tokens) long enough that 4 MB of text passes the byte
    // bound and is tokenized, then refused for its ~560k tokens.
    let s = TestServer::start(&model_with_context("server_qwen3_400k", 400_000), &[]);
    let body = json!({"prompt": "warm up", "max_tokens": 2}).to_string();
    assert_eq!(s.post("/v1/completions", &body).status, 200);
    let resident_before = s.proc_status_kib("VmRSS");
    let r = s.post_json("/v1/completions", &json!({"prompt": text_of(4 << 20), "max_tokens": 2}));
    assert_eq!(r.status, 400, "{:.300}", r.body);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("the prompt has"), "{}", r.body);
    let tokenizing_mib = (s.proc_status_kib("VmHWM") - resident_before) >> 10;
    assert!(tokenizing_mib > 100, "tokenizing took only {tokenizing_mib} MiB: the test no longer measures anything");
    let kept_mib = (s.proc_status_kib("VmRSS") as i64 - resident_before as i64) >> 10;
    assert!(kept_mib < 64, "{kept_mib} MiB stayed resident after the request");
}

#[test]
fn a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes() {
    let s = TestServer::start(&model(), &["--body-timeout-secs", "1", "--header-timeout-secs", "1"]);
    let addr = s.addr();
    let mut c = TcpStream::connect(&addr).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\"").unwrap();
    let reply = read_to_close(&mut c, Duration::from_secs(20));
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    let body: Value = serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "request_timeout");

    // An endless chunked body: cut at the deadline too.
    let mut c = TcpStream::connect(&addr).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    let start = Instant::now();
    let mut sent_until_cut = false;
    while start.elapsed() < Duration::from_secs(20) {
        if c.write_all(b"1\r\n \r\n").is_err() {
            sent_until_cut = true;
            break;
        }
        c.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut buf = [0u8; 512];
        if let Ok(n) = c.read(&mut buf) {
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"), "{:?}", String::from_utf8_lossy(&buf[..n]));
            sent_until_cut = true;
            break;
        }
    }
    assert!(sent_until_cut, "a trickled chunked body was never cut");

    // Headers that never end: 408 from the header timeout.
    let mut c = TcpStream::connect(&addr).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n").unwrap();
    let reply = read_to_close(&mut c, Duration::from_secs(20));
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert_eq!(s.get("/health").status, 200, "the server still serves");
}

#[test]
fn connections_beyond_the_limit_wait_until_one_closes() {
    let s = TestServer::start(&model(), &["--max-connections", "2", "--header-timeout-secs", "60"]);
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(s.addr()).unwrap()).collect();
    // Give the server a moment to take both.
    std::thread::sleep(Duration::from_millis(300));
    let mut third = TcpStream::connect(s.addr()).unwrap();
    write!(third, "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", s.addr()).unwrap();
    third.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let mut buf = [0u8; 64];
    let early = third.read(&mut buf);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "a third connection was served past --max-connections 2: {early:?}"
    );
    drop(idle);
    let reply = read_to_close(&mut third, Duration::from_secs(20));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[test]
fn sigterm_cuts_what_outlasts_the_grace_period_with_a_final_chunk_and_exits_non_zero() {
    let mut s = TestServer::start(&long_context_model(), &["--shutdown-grace-secs", "5"]);
    // Long enough to outlast the grace period many times over; three of them fit the KV pool
    // (the plan keeps a context's attention working memory beside it: ~2M tokens on 24 GB).
    let endless = |stream: bool| json!({"prompt": "the model", "max_tokens": 200_000, "ignore_eos": true, "stream": stream}).to_string();
    let mut stream = s.send_raw_post("/v1/completions", &endless(true));
    let mut whole = s.send_raw_post("/v1/completions", &endless(false));
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200_000, "ignore_eos": true, "stream": true}).to_string();
    let mut chat_stream = s.send_raw_post("/v1/chat/completions", &chat);
    wait_running(&s, 3);
    // A short request in flight when the signal comes finishes normally. "In flight" means the
    // engine has admitted it: a connection the server has not yet read when the signal comes is
    // refused with the listener (a CI run once signalled before the request was read).
    let admitted_before = metric(&s, "mlx_serve_prompt_tokens_total");
    let short = s.send_raw_post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 100, "ignore_eos": true}).to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&s, "mlx_serve_prompt_tokens_total") <= admitted_before {
        assert!(Instant::now() < deadline, "the short request was never admitted: {}", engine(&s));
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed = Command::new("kill").args(["-TERM", &s.pid().to_string()]).status().unwrap();
    assert!(killed.success());

    let mut short = short;
    let reply = read_to_close(&mut short, Duration::from_secs(30));
    assert!(reply.starts_with("HTTP/1.1 200"), "the short request was not allowed to finish: {reply}");
    for (conn, finish_field) in [(&mut stream, "text"), (&mut chat_stream, "delta")] {
        let reply = read_to_close(conn, Duration::from_secs(30));
        // Chunked transfer encoding frames each write; the events are the data lines.
        let data: Vec<&str> = reply.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "no [DONE] at the end: {:?}", &data[data.len().saturating_sub(3)..]);
        let last: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
        assert!(last["choices"][0].get(finish_field).is_some(), "{last}");
        assert_eq!(last["error"]["code"], "server_shutting_down", "{last}");
    }
    let reply = read_to_close(&mut whole, Duration::from_secs(30));
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    let body: Value = serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "server_shutting_down");
    let status = s.wait_exit(Duration::from_secs(30)).expect("the server did not exit");
    assert_eq!(status.code(), Some(1), "cut work must show in the exit status");
    assert!(s.stderr().iter().any(|l| l.contains("the shutdown cut 3 request(s) short")), "{:?}", s.stderr());
}

#[test]
fn with_an_api_key_metrics_and_health_details_need_it_and_a_plain_probe_stays_open() {
    let s = TestServer::start(&model(), &["--api-key", "sekrit"]);
    let key = ("Authorization", "Bearer sekrit");
    assert_eq!(s.get("/metrics").status, 401);
    assert_eq!(s.get_with_header("/metrics", ("Authorization", "Bearer sekri")).status, 401);
    assert_eq!(s.get_with_header("/metrics", ("Authorization", "Bearer sekritt")).status, 401);
    let m = s.get_with_header("/metrics", key);
    assert_eq!(m.status, 200);
    assert!(m.body.contains("mlx_serve_requests_total"));
    // Without credentials: liveness only.
    let probe = s.get("/health");
    assert_eq!(probe.status, 200);
    assert_eq!(probe.json(), json!({"status": "ok"}));
    assert_eq!(s.get_with_header("/health", ("Authorization", "Bearer wrong")).status, 401);
    let details = s.get_with_header("/health", key).json();
    assert!(details["engine"]["max_concurrency"].is_u64() && details["model"].is_string(), "{details}");
    // The prefill's defaults for this machine's backend: wide chunks and shared calls on a GPU.
    let gpu = mlx_rs_safe::kernels::gpu_backend().is_some();
    assert_eq!(details["engine"]["prefill_size"], json!(if gpu { 2048 } else { 512 }), "{details}");
    assert_eq!(details["engine"]["prompt_concurrency"], json!(if gpu { 8 } else { 1 }), "{details}");
}

#[test]
fn requests_naming_an_unexpected_host_get_403() {
    let s = TestServer::start(&model(), &["--allowed-host", "api.example.com"]);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    for host in ["evil.example", "rebind.attacker.example:5413", "127.0.0.1.nip.io"] {
        let r = s.get_with_header("/health", ("Host", host));
        assert_eq!(r.status, 403, "{host}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "host_not_allowed");
        assert_eq!(s.post_with_header("/v1/completions", &body, ("Host", host)).status, 403);
    }
    let port = s.addr().rsplit(':').next().unwrap().to_string();
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), "api.example.com".to_string()] {
        assert_eq!(s.post_with_header("/v1/completions", &body, ("Host", &host)).status, 200, "{host}");
    }
}

#[test]
fn posts_without_a_json_content_type_get_415() {
    let s = TestServer::start(&model(), &[]);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let addr = s.addr();
    let post = |content_type: Option<&str>| -> String {
        let mut c = TcpStream::connect(&addr).unwrap();
        let header = content_type.map(|t| format!("Content-Type: {t}\r\n")).unwrap_or_default();
        write!(c, "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{header}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        read_to_close(&mut c, Duration::from_secs(30))
    };
    for t in [None, Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("multipart/form-data; boundary=x")] {
        let reply = post(t);
        assert!(reply.starts_with("HTTP/1.1 415"), "{t:?}: {reply}");
        let e: Value = serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(e["error"]["code"], "unsupported_media_type", "{e}");
    }
    for t in ["application/json", "application/json; charset=utf-8", "Application/JSON"] {
        let reply = post(Some(t));
        assert!(reply.starts_with("HTTP/1.1 200"), "{t}: {reply}");
    }
}

#[test]
fn listening_beyond_loopback_without_a_key_warns_loudly() {
    let open = TestServer::start(&model(), &["--host", "0.0.0.0"]);
    let warned = |s: &TestServer| s.stderr().iter().any(|l| l.starts_with("WARNING") && l.contains("WITHOUT --api-key"));
    assert!(warned(&open), "{:?}", open.stderr());
    let keyed = TestServer::start(&model(), &["--host", "0.0.0.0", "--api-key", "k"]);
    let local = TestServer::start(&model(), &[]);
    assert!(!warned(&keyed) && !warned(&local));
}

/// The CORS headers of a preflight from `origin`, asking for the headers
/// the OpenAI and Anthropic browser SDKs send.
fn preflight(s: &TestServer, origin: &str) -> (u16, Option<String>) {
    let addr = s.addr();
    let mut c = TcpStream::connect(&addr).unwrap();
    write!(
        c,
        "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
         Access-Control-Request-Headers: content-type, authorization, x-stainless-os, x-api-key, anthropic-version\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let reply = read_to_close(&mut c, Duration::from_secs(30));
    let status = reply[9..12].parse().unwrap();
    let allowed = reply
        .lines()
        .find_map(|l| l.to_ascii_lowercase().starts_with("access-control-allow-origin:").then(|| l[28..].trim().to_string()));
    (status, allowed)
}

#[test]
fn cors_origin_lets_only_the_named_origins_call_from_a_browser() {
    let s = TestServer::start(&model(), &["--cors-origin", "http://app.example,https://other.example:8443"]);
    assert_eq!(preflight(&s, "http://app.example"), (200, Some("http://app.example".into())));
    assert_eq!(preflight(&s, "https://other.example:8443").1.as_deref(), Some("https://other.example:8443"));
    assert_eq!(preflight(&s, "http://evil.example").1, None);
    let r = ureq::post(&s.url("/v1/completions"))
        .set("Origin", "http://app.example")
        .set("Content-Type", "application/json")
        .send_string(&json!({"prompt": "hi", "max_tokens": 2}).to_string())
        .unwrap();
    assert_eq!(r.header("access-control-allow-origin"), Some("http://app.example"));
    // Without the flag no origin is let in.
    let plain = TestServer::start(&model(), &[]);
    assert_eq!(preflight(&plain, "http://app.example").1, None);
    let e = start_failure(&model(), &["--cors-origin", "app.example/path"]);
    assert!(e.contains("--cors-origin"), "{e}");
}

#[test]
fn a_config_field_of_the_wrong_type_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(model()).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    // A string where a number belongs: read as "no context length" before.
    config["max_position_embeddings"] = json!("2048");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let e = start_failure(dir.path(), &[]);
    assert!(e.contains("config.json") && e.contains("max_position_embeddings") && e.contains("invalid type"), "{e}");
}

#[test]
fn a_kv_group_size_the_head_dim_cannot_take_is_refused_at_start() {
    // The test model's heads are 16 wide; MLX's smallest group is 32.
    let e = start_failure(&model(), &["--kv-bits", "8", "--kv-group-size", "32"]);
    assert!(e.contains("--kv-group-size 32") && e.contains("head dimension 16"), "{e}");
}

#[test]
fn zero_prompts_a_prefill_call_is_refused_at_start() {
    let e = start_failure(&model(), &["--prompt-concurrency", "0"]);
    assert!(e.contains("--prompt-concurrency must be at least 1"), "{e}");
}

/// A small deterministic generator (xorshift64*), so a failing body can be reproduced.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn string(&mut self) -> String {
        let pieces = ["", "a", "hello world", "東京", "🦀", "\u{0}", "\n\t", "\"}", "<|im_start|>", "\u{202e}", "é", "{{ x }}", "{% raise %}"];
        (0..self.below(6)).map(|_| *self.pick(&pieces)).collect::<String>()
    }

    /// Any JSON value, nested up to `depth`. Numbers avoid 8..2048, where a
    /// valid max_tokens would make the run long, not more thorough.
    fn value(&mut self, depth: usize) -> Value {
        match self.below(if depth == 0 { 6 } else { 8 }) {
            0 => Value::Null,
            1 => json!(self.below(2) == 1),
            2 => json!(*self.pick(&[-5i64, -1, 0, 1, 2, 3, 7, 100_000, 4_294_967_296, i64::MAX, i64::MIN])),
            3 => json!(*self.pick(&[0.0f64, -0.0, 0.5, 1.5, 2.5, -3.25, 1e-30, 1e300, -1e300])),
            4 => json!(u64::MAX),
            5 => json!(self.string()),
            6 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
            _ => {
                let keys = ["role", "content", "type", "text", "name", "function", "arguments", "x"];
                Value::Object((0..self.below(4)).map(|_| (self.pick(&keys).to_string(), self.value(depth - 1))).collect())
            }
        }
    }

    fn message(&mut self) -> Value {
        if self.below(4) == 0 {
            return self.value(2);
        }
        let role = *self.pick(&["user", "system", "assistant", "tool", "developer", "wizard", ""]);
        let content = match self.below(4) {
            0 => self.value(2),
            1 => json!([{"type": "text", "text": self.string()}]),
            _ => json!(self.string()),
        };
        json!({"role": role, "content": content})
    }

    /// A request body: mostly well-formed with fields of random type and value.
    fn body(&mut self, chat: bool) -> String {
        match self.below(20) {
            0 => return "{".repeat(self.below(300)),
            1 => return format!("{{\"messages\": [{}]}}", "[".repeat(200)),
            2 => return String::from_utf8_lossy(&(0..self.below(64)).map(|_| self.next() as u8).collect::<Vec<_>>()).into_owned(),
            3 => return json!({"prompt": "x", "max_tokens": 2}).to_string().replace('2', "1e999999"),
            _ => {}
        }
        let mut body = serde_json::Map::new();
        if chat {
            body.insert("messages".into(), if self.below(5) == 0 { self.value(2) } else { Value::Array((0..1 + self.below(3)).map(|_| self.message()).collect()) });
        } else {
            let prompt = match self.below(4) {
                0 => self.value(2),
                1 => json!((0..self.below(6)).map(|_| self.below(700) as i64 - 50).collect::<Vec<_>>()),
                _ => json!(self.string()),
            };
            body.insert("prompt".into(), prompt);
        }
        let fields = [
            "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
            "repetition_context_size", "presence_penalty", "presence_context_size", "frequency_penalty", "frequency_context_size",
            "logit_bias", "seed", "stop", "n", "stream",
            "stream_options", "logprobs", "top_logprobs", "echo", "tools", "tool_choice", "ignore_eos",
        ];
        for _ in 0..self.below(6) {
            let field = *self.pick(&fields);
            // Half the time a value of the field's own kind, so that bodies get
            // past the type checks and reach sampling and the engine.
            let v = match (field, self.below(2)) {
                (_, 0) => self.value(2),
                ("logit_bias", _) => json!({self.below(600).to_string(): self.pick(&[-100.0, 5.0, 100.0, 1e9])}),
                ("stop", _) => json!([self.string(), self.string()]),
                ("tools", _) => json!([{"type": "function", "function": {"name": self.string(), "parameters": self.value(2)}}]),
                ("stream_options", _) => json!({"include_usage": self.below(2) == 1}),
                ("stream" | "echo" | "ignore_eos", _) => json!(self.below(2) == 1),
                ("logprobs", _) if chat => json!(self.below(2) == 1),
                ("logprobs" | "top_logprobs" | "top_k" | "max_tokens" | "max_completion_tokens" | "n" | "seed" | "repetition_context_size"
                | "presence_context_size" | "frequency_context_size", _) => {
                    json!(*self.pick(&[-1i64, 0, 1, 2, 3, 5, 20, 21]))
                }
                ("tool_choice", _) => json!(*self.pick(&["none", "auto", "required"])),
                ("model", _) => json!(*self.pick(&["", "default_model", "gpt-4"])),
                _ => json!(*self.pick(&[-1.0f64, 0.0, 0.1, 0.5, 0.9, 1.0, 1.2, 2.0, 3.0])),
            };
            body.insert(field.into(), v);
        }
        if !body.contains_key("max_tokens") {
            body.insert("max_tokens".into(), json!(3));
        }
        Value::Object(body).to_string()
    }
}

/// Sends `body`; the status and the body text.
fn send(agent: &ureq::Agent, url: &str, body: &str) -> (u16, String) {
    let res = agent.post(url).set("Content-Type", "application/json").send_string(body);
    let r = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error for {body:.300}: {e}"),
    };
    let status = r.status();
    (status, r.into_string().unwrap_or_else(|e| format!("<unreadable: {e}>")))
}

#[test]
fn two_thousand_fuzzed_bodies_get_no_5xx_and_errors_are_api_json() {
    let s = TestServer::start(&model(), &["--max-tokens", "4"]);
    let per_thread = 520;
    let results: Vec<(usize, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let s = &s;
                scope.spawn(move || {
                    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
                    let (mut ok, mut refused) = (0, 0);
                    for _ in 0..per_thread {
                        let chat = rng.below(2) == 0;
                        let body = rng.body(chat);
                        let url = s.url(if chat { "/v1/chat/completions" } else { "/v1/completions" });
                        let (status, text) = send(&agent, &url, &body);
                        assert!(status < 500, "{status} for {body:.400}: {text:.400}");
                        if status >= 400 {
                            let e: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status} not JSON for {body:.300}: {text:.300}"));
                            assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body:.300}: {text:.300}");
                            refused += 1;
                        } else if text.starts_with("data: ") {
                            assert!(text.ends_with("data: [DONE]\n\n"), "{body:.300}: {text:.300}");
                            ok += 1;
                        } else {
                            serde_json::from_str::<Value>(&text).unwrap_or_else(|_| panic!("200 not JSON for {body:.300}: {text:.300}"));
                            ok += 1;
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (ok, refused) = results.iter().fold((0, 0), |(a, b), (o, r)| (a + o, b + r));
    eprintln!("fuzz: {ok} answered, {refused} refused with 4xx");
    assert!(ok + refused >= 2000);
    assert!(ok > 50 && refused > 500, "the generator should produce both kinds: {ok} ok, {refused} refused");
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn sixty_four_clients_with_disconnects_all_get_answers_and_memory_returns_to_baseline() {
    // Abandoned requests ask for a million tokens: only cancelling them frees their slots.
    let s = TestServer::start(&long_context_model(), &["--prompt-cache-bytes", "0"]);
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
    let post = |body: &str| send(&agent, &s.url("/v1/completions"), body);
    let request = |stream: bool, max_tokens: u64| {
        json!({"prompt": "the model token server", "max_tokens": max_tokens, "ignore_eos": true, "stream": stream}).to_string()
    };
    // Warm up both paths, then take the baseline.
    assert_eq!(s.post("/v1/completions", &request(false, 4)).status, 200);
    assert_eq!(s.post("/v1/completions", &request(true, 4)).status, 200);
    let idle = |s: &TestServer| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let h = s.get("/health").json();
            if h["engine"]["running"] == 0 && h["engine"]["queued"] == 0 {
                return h;
            }
            assert!(Instant::now() < deadline, "the engine did not go idle: {h}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let base = idle(&s);
    let rss_before = s.proc_status_kib("VmRSS");
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..64)
            .map(|i| {
                let (s, request, post) = (&s, &request, &post);
                scope.spawn(move || -> Vec<String> {
                    let mut failed = Vec::new();
                    for round in 0..3 {
                        match (i + round) % 4 {
                            // A stream dropped after its first chunk.
                            0 => {
                                let mut c = s.send_raw_post("/v1/completions", &request(true, 1_000_000));
                                c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                                let mut buf = [0u8; 1024];
                                match c.read(&mut buf) {
                                    Ok(n) if String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200") => {}
                                    other => failed.push(format!("dropped stream: {other:?}")),
                                }
                            }
                            // A whole answer abandoned while it generates.
                            1 => {
                                let c = s.send_raw_post("/v1/completions", &request(false, 1_000_000));
                                std::thread::sleep(Duration::from_millis(30));
                                drop(c);
                            }
                            2 => {
                                let (status, body) = post(&request(true, 8));
                                if status != 200 || !body.ends_with("data: [DONE]\n\n") {
                                    failed.push(format!("stream {status}: {body:.200}"));
                                }
                            }
                            _ => {
                                let (status, body) = post(&request(false, 8));
                                let tokens = serde_json::from_str::<Value>(&body).ok().map(|v| v["usage"]["completion_tokens"].clone());
                                if status != 200 || tokens != Some(json!(8)) {
                                    failed.push(format!("whole {status}: {body:.200}"));
                                }
                            }
                        }
                    }
                    failed
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "{} failed: {:?}", failures.len(), &failures[..failures.len().min(5)]);
    let after = idle(&s);
    assert_eq!(after["engine"]["kv_cache_bytes"], 0);
    let grew = after["memory"]["active_bytes"].as_i64().unwrap() - base["memory"]["active_bytes"].as_i64().unwrap();
    assert!(grew.abs() < 256 * 1024, "{grew} bytes of MLX memory stayed allocated after the load");
    assert!(metric(&s, "mlx_serve_cancelled_total") >= 16.0, "abandoned requests were cancelled");
    let rss_grew_mib = (s.proc_status_kib("VmRSS") as i64 - rss_before as i64) >> 10;
    assert!(rss_grew_mib < 256, "resident memory grew by {rss_grew_mib} MiB");
    assert_eq!(s.post("/v1/completions", &request(false, 2)).status, 200);
}

//! A real `mlx-serve` process on a free port, and a small blocking HTTP client
//! for it (ureq).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

pub struct TestServer {
    child: Child,
    pub base: String,
    /// Every line the server wrote to stderr so far.
    stderr: Arc<Mutex<Vec<String>>>,
}

pub fn binary() -> String {
    std::env::var("MLX_SERVE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mlx-serve").into())
}

/// Starts the server on `model` with `flags`, expecting it to refuse them at
/// start: returns what it wrote to stderr.
pub fn refused_start(model: &Path, flags: &[&str]) -> String {
    let out = Command::new(binary()).arg("--model").arg(model).args(["--port", "0"]).args(flags).output().unwrap();
    assert!(!out.status.success(), "{flags:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An HTTP answer: status, headers we look at, body.
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub retry_after: Option<String>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn reply(r: ureq::Response) -> Reply {
    let status = r.status();
    let content_type = r.header("content-type").unwrap_or("").to_string();
    let retry_after = r.header("retry-after").map(str::to_string);
    let mut body = String::new();
    r.into_reader().read_to_string(&mut body).unwrap();
    Reply { status, content_type, retry_after, body }
}

/// Longer than any answer a test waits for on 2 slow cores: a request still
/// unanswered is a hang, which fails its test rather than stalling the run.
const REQUEST_LIMIT: Duration = Duration::from_secs(600);

fn send(req: ureq::Request, body: Option<&str>) -> Reply {
    let req = req.timeout(REQUEST_LIMIT);
    let res = match body {
        Some(b) => req.set("content-type", "application/json").send_string(b),
        None => req.call(),
    };
    match res {
        Ok(r) => reply(r),
        Err(ureq::Error::Status(_, r)) => reply(r),
        Err(e) => panic!("request failed: {e}"),
    }
}

impl TestServer {
    /// Starts the server on `model` with extra flags; returns once it listens.
    pub fn start(model: &Path, extra: &[&str]) -> TestServer {
        let mut args = vec!["--model", model.to_str().unwrap()];
        args.extend_from_slice(extra);
        TestServer::start_with(&args)
    }

    /// Starts the server with exactly these flags (and a free port, quiet
    /// logs); without --model it serves the default model.
    pub fn start_with(flags: &[&str]) -> TestServer {
        TestServer::start_by(Command::new(binary()), flags)
    }

    /// Starts the server with these flags by `command`: the binary, or a
    /// wrapper that execs the program and arguments it is given.
    pub fn start_by(mut command: Command, flags: &[&str]) -> TestServer {
        let mut child = command
            .env_remove("MLX_SERVE_MODEL")
            .args(["--port", "0", "--log-level", "warn"])
            .args(flags)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start mlx-serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = lines.clone();
        // Reads the listening line, then keeps draining so the pipe never fills.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line.clone());
                if let Some(addr) = line.strip_prefix("mlx-serve: listening on ") {
                    let _ = tx.send(Ok(addr.to_string()));
                } else if line.starts_with("mlx-serve: ") {
                    let _ = tx.send(Err(line.clone()));
                }
                eprintln!("[server] {line}");
            }
        });
        // A CUDA machine's first start compiles MLX's kernels and ours for its
        // start-up checks (~2 min on an H200 with nothing cached, longer while
        // other tests compile beside it): it gets longer than the CPU.
        let limit = if mlx_rs_safe::kernels::gpu_backend() == Some("cuda") { 600 } else { 120 };
        let base = match rx.recv_timeout(Duration::from_secs(limit)) {
            Ok(Ok(addr)) => addr,
            Ok(Err(line)) => panic!("the server failed to start: {line}"),
            Err(_) => panic!("the server did not start within {limit} s"),
        };
        TestServer { child, base, stderr: lines }
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// host:port, for raw connections.
    pub fn addr(&self) -> String {
        self.base.strip_prefix("http://").unwrap().to_string()
    }

    /// A field of /proc/PID/status in KiB (VmRSS: resident now, VmHWM: the peak).
    pub fn proc_status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap_or_else(|| panic!("no {field} in {status}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Opens a connection and sends a JSON POST on it, leaving the answer unread.
    pub fn send_raw_post(&self, path: &str, body: &str) -> std::net::TcpStream {
        use std::io::Write;
        let addr = self.addr();
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        write!(c, "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        c
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn post(&self, path: &str, body: &str) -> Reply {
        send(ureq::post(&self.url(path)), Some(body))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.post(path, &body.to_string())
    }

    pub fn post_with_header(&self, path: &str, body: &str, header: (&str, &str)) -> Reply {
        send(ureq::post(&self.url(path)).set(header.0, header.1), Some(body))
    }

    pub fn get(&self, path: &str) -> Reply {
        send(ureq::get(&self.url(path)), None)
    }

    pub fn get_with_header(&self, path: &str, header: (&str, &str)) -> Reply {
        send(ureq::get(&self.url(path)).set(header.0, header.1), None)
    }

    /// Sends the completion requests `bodies` at once (a thread each); the
    /// texts of their 200 answers, in order.
    pub fn completions_at_once(&self, bodies: &[Value]) -> Vec<String> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = bodies
                .iter()
                .map(|b| {
                    scope.spawn(move || {
                        let r = self.post_json("/v1/completions", b);
                        assert_eq!(r.status, 200, "{}", r.body);
                        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics").body
    }

    /// Waits (bounded) for the process to exit; its status.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap_or(e).to_string()).collect()
}

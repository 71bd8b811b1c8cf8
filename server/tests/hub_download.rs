//! `hub::resolve` against a real HTTP server on 127.0.0.1 that speaks the Hugging Face hub's
//! URL layout (repo info API, `resolve` URLs, LFS redirects to a CDN path), through the real
//! hf-hub crate. Every test passes endpoint and cache through `HubOptions`, never the
//! environment, so tests can run in parallel.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mlx_serve::error::Error;
use mlx_serve::hub::{resolve, HubOptions};

const REPO: &str = "test-org/tiny-model";
const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

/// The fake repo: file name → bytes. Large files (safetensors, .bin) are "LFS" files.
fn repo_files() -> BTreeMap<&'static str, Vec<u8>> {
    let weights = |seed: u8, len: usize| {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    };
    BTreeMap::from([
        ("config.json", br#"{"model_type":"llama","hidden_size":8}"#.to_vec()),
        ("tokenizer.json", br#"{"version":"1.0","model":{"type":"BPE"}}"#.to_vec()),
        ("tokenizer_config.json", br#"{"eos_token":"</s>"}"#.to_vec()),
        ("chat_template.jinja", b"{% for m in messages %}{{ m.content }}{% endfor %}".to_vec()),
        (
            "model.safetensors.index.json",
            br#"{"weight_map":{"a":"model-00001-of-00002.safetensors",
                               "b":"model-00002-of-00002.safetensors"}}"#
                .to_vec(),
        ),
        ("model-00001-of-00002.safetensors", weights(1, 300_000)),
        ("model-00002-of-00002.safetensors", weights(2, 123_457)),
        ("pytorch_model.bin", weights(3, 50_000)),
        ("README.md", b"# tiny model".to_vec()),
        (".gitattributes", b"*.safetensors filter=lfs".to_vec()),
        ("original/model.safetensors", weights(4, 1000)),
    ])
}

const NEEDED: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// A blob name standing in for the hub's etag (git sha1 / sha256): FNV-1a of the bytes.
fn etag(bytes: &[u8]) -> String {
    let hash = bytes
        .iter()
        .fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    format!("{hash:016x}{:08x}", bytes.len())
}

type Repos = BTreeMap<&'static str, BTreeMap<&'static str, Vec<u8>>>;

struct FakeHub {
    addr: SocketAddr,
    state: Arc<State>,
    thread: Option<JoinHandle<()>>,
}

struct State {
    repos: Repos,
    /// Every request, as "METHOD /path?query".
    log: Mutex<Vec<String>>,
    stop: AtomicBool,
    /// Cut the next large body short, as a dropped connection does.
    cut_next_body: AtomicBool,
}

impl FakeHub {
    /// Serves `repos` (repo id → files) at commit `SHA`, on revisions "main" and `SHA`.
    fn start(repos: Repos) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            repos,
            log: Mutex::default(),
            stop: AtomicBool::new(false),
            cut_next_body: AtomicBool::new(false),
        });
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    serve(stream, &shared);
                }
            }
        });
        FakeHub { addr, state, thread: Some(thread) }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.state.log.lock().unwrap().clone()
    }

    /// Stops the server and closes its port.
    fn shut_down(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn serve(stream: TcpStream, state: &State) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() || request_line.is_empty() {
        return;
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) =
        (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    state.log.lock().unwrap().push(format!("{method} {target}"));
    let path = target.split('?').next().unwrap_or("");
    let response = route(path, &headers, &state.repos);
    let mut out = stream;
    let mut head = format!("HTTP/1.1 {}\r\n", response.status);
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", response.body.len()));
    let _ = out.write_all(head.as_bytes());
    let mut body = &response.body[..];
    if body.len() > 1000 && state.cut_next_body.swap(false, Ordering::SeqCst) {
        body = &body[..body.len() / 2]; // then close: the client sees a premature end
    }
    if method != "HEAD" {
        let _ = out.write_all(body);
    }
    let _ = out.flush();
}

struct Response {
    status: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

fn not_found(code: &str) -> Response {
    Response {
        status: "404 Not Found",
        headers: vec![("X-Error-Code", code.to_string())],
        body: b"{\"error\":\"not found\"}".to_vec(),
    }
}

fn route(path: &str, headers: &BTreeMap<String, String>, repos: &Repos) -> Response {
    // GET /api/models/{org}/{name}/revision/{rev}
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, rev)) = rest.split_once("/revision/") else {
            return not_found("EntryNotFound");
        };
        let Some(files) = repos.get(repo) else {
            return not_found("RepoNotFound");
        };
        if rev != "main" && rev != SHA {
            return not_found("RevisionNotFound");
        }
        let siblings: Vec<_> = files
            .iter()
            .map(|(name, bytes)| serde_json::json!({"rfilename": name, "size": bytes.len()}))
            .collect();
        let body = serde_json::json!({"id": repo, "sha": SHA, "siblings": siblings}).to_string();
        return Response {
            status: "200 OK",
            headers: vec![("Content-Type", "application/json".into())],
            body: body.into_bytes(),
        };
    }
    // GET /cdn/{etag}: where LFS files redirect to, like the hub's CDN.
    if let Some(tag) = path.strip_prefix("/cdn/") {
        let file = repos.values().flat_map(|files| files.values()).find(|bytes| etag(bytes) == tag);
        return match file {
            Some(bytes) => ranged(bytes, headers, Vec::new()),
            None => not_found("EntryNotFound"),
        };
    }
    // GET /{org}/{name}/resolve/{rev}/{file}
    let Some((repo, rest)) = path.trim_start_matches('/').split_once("/resolve/") else {
        return not_found("EntryNotFound");
    };
    let Some(files) = repos.get(repo) else {
        return not_found("RepoNotFound");
    };
    let Some((rev, name)) = rest.split_once('/') else {
        return not_found("EntryNotFound");
    };
    if rev != "main" && rev != SHA {
        return not_found("RevisionNotFound");
    }
    let Some(bytes) = files.get(name) else {
        return not_found("EntryNotFound");
    };
    let tag = etag(bytes);
    if name.ends_with(".safetensors") || name.ends_with(".bin") {
        let headers = vec![
            ("X-Repo-Commit", SHA.to_string()),
            ("X-Linked-Etag", format!("\"{tag}\"")),
            ("X-Linked-Size", bytes.len().to_string()),
            ("ETag", "\"pointer-etag\"".to_string()),
            ("Location", format!("http://{}/cdn/{tag}", headers["host"])),
        ];
        return Response { status: "302 Found", headers, body: Vec::new() };
    }
    ranged(bytes, headers, vec![("X-Repo-Commit", SHA.to_string()), ("ETag", format!("\"{tag}\""))])
}

/// The file's bytes, honouring `Range: bytes=a-` / `bytes=a-b` as hf-hub sends it.
fn ranged(
    bytes: &[u8],
    request: &BTreeMap<String, String>,
    mut headers: Vec<(&'static str, String)>,
) -> Response {
    let Some(range) = request.get("range").and_then(|r| r.strip_prefix("bytes=")) else {
        return Response { status: "200 OK", headers, body: bytes.to_vec() };
    };
    let (start, end) = range.split_once('-').unwrap();
    let start: usize = start.parse().unwrap();
    let end: usize = if end.is_empty() {
        bytes.len() - 1
    } else {
        end.parse::<usize>().unwrap().min(bytes.len() - 1)
    };
    headers.push(("Content-Range", format!("bytes {start}-{end}/{}", bytes.len())));
    Response { status: "206 Partial Content", headers, body: bytes[start..=end].to_vec() }
}

fn options(endpoint: &str, cache: &Path) -> HubOptions {
    HubOptions {
        endpoint: Some(endpoint.to_string()),
        cache_dir: Some(cache.to_path_buf()),
        ..HubOptions::default()
    }
}

fn hub_message(result: mlx_serve::error::Result<PathBuf>) -> String {
    match result {
        Err(Error::Hub { model, message }) => {
            eprintln!("model {model}: {message}");
            format!("model {model}: {message}")
        }
        other => panic!("expected Error::Hub, got {other:?}"),
    }
}

#[test]
fn downloads_only_needed_files_into_hf_cache_and_reuses_them_without_network() {
    let mut hub = FakeHub::start(BTreeMap::from([(REPO, repo_files())]));
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&hub.endpoint(), cache.path());

    let snapshot = resolve(REPO, &opts).unwrap();
    let repo_dir = cache.path().join("models--test-org--tiny-model");
    assert_eq!(snapshot, repo_dir.join("snapshots").join(SHA));
    let files = repo_files();
    for name in NEEDED {
        let got = std::fs::read(snapshot.join(name)).unwrap();
        assert!(got == files[name], "{name}: wrong bytes");
        // As huggingface_hub lays it out: the snapshot entry links to a blob.
        assert!(snapshot.join(name).symlink_metadata().unwrap().file_type().is_symlink(), "{name}");
    }
    for skipped in ["pytorch_model.bin", "README.md", ".gitattributes", "original"] {
        assert!(!snapshot.join(skipped).exists(), "{skipped} was downloaded");
    }
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(), SHA);
    assert!(!repo_dir.join("refs").join(SHA).exists(), "stray refs/<commit>");
    // One blob per needed file; hf-hub leaves an empty `<blob>.lock` beside each, harmless.
    let blobs: Vec<String> = std::fs::read_dir(repo_dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    assert_eq!(blobs.len(), NEEDED.len(), "{blobs:?}");
    assert!(!blobs.iter().any(|name| name.ends_with(".part")), "{blobs:?}");
    let requests = hub.requests();
    assert!(
        requests[0].starts_with("GET /api/models/test-org/tiny-model/revision/main"),
        "{requests:?}"
    );
    for unwanted in ["README", "pytorch_model", "gitattributes", "original"] {
        assert!(
            !requests.iter().any(|r| r.contains(unwanted)),
            "{unwanted} requested: {requests:?}"
        );
    }

    // Second resolve, hub up: only the repo listing, no file is fetched again.
    let before = hub.requests().len();
    assert_eq!(resolve(REPO, &opts).unwrap(), snapshot);
    let again = &hub.requests()[before..];
    assert_eq!(again.len(), 1, "{again:?}");

    // Hub down: the cached snapshot is used, online or offline, by branch or by commit.
    hub.shut_down();
    assert_eq!(resolve(REPO, &opts).unwrap(), snapshot);
    let offline = HubOptions { offline: true, ..opts.clone() };
    assert_eq!(resolve(REPO, &offline).unwrap(), snapshot);
    let pinned = HubOptions { revision: Some(SHA.to_string()), ..offline };
    assert_eq!(resolve(REPO, &pinned).unwrap(), snapshot);
}

#[test]
fn offline_without_cached_model_names_the_repo() {
    let cache = tempfile::tempdir().unwrap();
    let opts = HubOptions { offline: true, ..options("http://127.0.0.1:9", cache.path()) };
    let message = hub_message(resolve("some-org/not-cached", &opts));
    assert!(message.contains("some-org/not-cached") && message.contains("offline"), "{message}");
}

#[test]
fn unknown_repo_and_revision_are_errors_naming_them() {
    let hub = FakeHub::start(BTreeMap::from([(REPO, repo_files())]));
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&hub.endpoint(), cache.path());
    let message = hub_message(resolve("test-org/no-such-model", &opts));
    assert!(
        message.contains("test-org/no-such-model") && message.contains("not found"),
        "{message}"
    );

    let opts = HubOptions { revision: Some("v9".into()), ..opts };
    let message = hub_message(resolve(REPO, &opts));
    assert!(message.contains("\"v9\" not found"), "{message}");
}

#[test]
fn repo_without_safetensors_is_refused_before_downloading() {
    let mut files = repo_files();
    files.retain(|name, _| !name.ends_with(".safetensors") && !name.ends_with(".index.json"));
    let hub = FakeHub::start(BTreeMap::from([("test-org/pytorch-only", files)]));
    let cache = tempfile::tempdir().unwrap();
    let message =
        hub_message(resolve("test-org/pytorch-only", &options(&hub.endpoint(), cache.path())));
    assert!(message.contains("safetensors"), "{message}");
    assert_eq!(hub.requests().len(), 1, "{:?}", hub.requests());
}

#[test]
fn unreachable_hub_without_cache_is_a_clear_error() {
    // A port that was free a moment ago, closed again: connections are refused.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cache = tempfile::tempdir().unwrap();
    let message =
        hub_message(resolve(REPO, &options(&format!("http://127.0.0.1:{port}"), cache.path())));
    assert!(message.contains(REPO) && message.contains("cannot reach"), "{message}");
}

#[test]
fn local_directory_is_returned_canonicalized() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    let opts = options("http://127.0.0.1:9", dir.path());
    let given = format!("{}/./", dir.path().display());
    assert_eq!(resolve(&given, &opts).unwrap(), dir.path().canonicalize().unwrap());
    assert_eq!(resolve(".", &opts).unwrap(), Path::new(".").canonicalize().unwrap());
}

#[test]
fn missing_or_non_directory_paths_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options("http://127.0.0.1:9", dir.path());
    let file = dir.path().join("config.json");
    std::fs::write(&file, "{}").unwrap();
    let missing = dir.path().join("no-such-model");
    let cases = [
        missing.display().to_string(),
        "./no-such-model-dir".into(),
        "~/no-such-model-dir-xyz".into(),
    ];
    for path in cases.iter().chain([&file.display().to_string()]) {
        match resolve(path, &opts) {
            Err(Error::ModelFile { file, message }) => {
                assert!(!file.is_empty() && !message.is_empty())
            }
            other => panic!("{path}: expected Error::ModelFile, got {other:?}"),
        }
    }
    let message = hub_message(resolve("a/b/c", &opts));
    assert!(message.contains("a/b/c"), "{message}");
}

#[test]
fn interrupted_download_resumes_with_a_range_request() {
    let hub = FakeHub::start(BTreeMap::from([(REPO, repo_files())]));
    let cache = tempfile::tempdir().unwrap();
    hub.state.cut_next_body.store(true, Ordering::SeqCst);
    let snapshot = resolve(REPO, &options(&hub.endpoint(), cache.path())).unwrap();
    let files = repo_files();
    for name in NEEDED {
        assert!(std::fs::read(snapshot.join(name)).unwrap() == files[name], "{name}: wrong bytes");
    }
    let requests = hub.requests();
    let shard = &files["model-00001-of-00002.safetensors"];
    let cdn = format!("GET /cdn/{}", etag(shard));
    assert_eq!(requests.iter().filter(|r| **r == cdn).count(), 3, "{requests:#?}");
}

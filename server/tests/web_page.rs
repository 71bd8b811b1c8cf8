//! The chat page at `/`: served by the binary (no key needed for the page
//! itself, a strict Content-Security-Policy), and driven in a real headless
//! Chromium by Playwright (server/tests/web_page.py) against a real server.

mod common;

use common::models::{long_context_model, THINKING_TEMPLATE};
use common::server::TestServer;
use mlx_serve::metrics::counter_value;

#[test]
fn the_page_and_its_files_are_served_without_the_key_and_unknown_files_are_404() {
    let s = TestServer::start(&long_context_model(), &["--api-key", "k"]);
    let page = ureq::get(&s.url("/")).call().unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.content_type(), "text/html");
    let csp = page.header("content-security-policy").unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"), "{csp}");
    let html = page.into_string().unwrap();
    let head = ureq::head(&s.url("/")).call().unwrap();
    assert_eq!((head.status(), head.content_type()), (200, "text/html"));
    assert_eq!(head.into_string().unwrap(), "", "HEAD answers the headers only");
    for file in ["/web/app.js", "/web/markdown.js", "/web/style.css"] {
        assert!(html.contains(file), "the page does not load {file}");
        let r = s.get(file);
        assert_eq!(r.status, 200, "{file}");
        assert!(r.content_type.starts_with(if file.ends_with(".css") { "text/css" } else { "text/javascript" }), "{file}: {}", r.content_type);
    }
    let missing = s.get("/web/secrets.txt");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "unknown_url");
    // The API behind it still wants the key.
    assert_eq!(s.get("/metrics").status, 401);
}

#[test]
fn a_conversation_in_headless_chromium_streams_stops_calls_tools_and_survives_a_reload() {
    let dir = common::copy_of(&long_context_model(), "web_page", "thinking");
    std::fs::write(dir.join("chat_template.jinja"), THINKING_TEMPLATE).unwrap();
    // Prefill in chunks of 16 tokens: the page's progress bar has something to show.
    let flags = ["--api-key", "k", "--tool-call-parser", "hermes", "--prefill-size", "16", "--served-model-name", "tiny-thinker"];
    let s = TestServer::start(&dir, &flags);
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web_page");
    let out = std::process::Command::new(common::python())
        .arg(common::repo().join("server/tests/web_page.py"))
        .arg(&s.base)
        .arg("k")
        .arg(&shots)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the browser test failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("web page: all checks passed"), "{stdout}");
    for shot in ["chat.png", "tool-call.png"] {
        let bytes = std::fs::read(shots.join(shot)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "{shot}: {} bytes", bytes.len());
    }
    // The Stop button cancelled its request on the server.
    let metrics = ureq::get(&s.url("/metrics")).set("Authorization", "Bearer k").call().unwrap().into_string().unwrap();
    assert!(counter_value(&metrics, "mlx_serve_cancelled_total").unwrap() >= 1.0, "{metrics}");
}

//! The chat page for people, served by the binary itself: its files are
//! compiled in (no Node, no network, nothing to install beside the binary).
//! The page holds no data of the server's, so it is served without the API
//! key; it asks for the key and sends it with its API calls.

use std::time::Instant;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};

use super::error::ApiError;
use super::AppState;

/// (path under /web/, content type, bytes).
const ASSETS: [(&str, &str, &str); 3] = [
    ("app.js", "text/javascript; charset=utf-8", include_str!("../../web/app.js")),
    ("markdown.js", "text/javascript; charset=utf-8", include_str!("../../web/markdown.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../../web/style.css")),
];
const INDEX: &str = include_str!("../../web/index.html");

/// Only the page's own files run, and it talks only to this server: model
/// output the page renders can never load a script or send data elsewhere.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn page_file(content_type: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(body)
}

pub async fn index(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    state.finish(&req, "/", start, Ok(page_file("text/html; charset=utf-8", INDEX)))
}

pub async fn asset(req: HttpRequest, path: web::Path<String>, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = match ASSETS.iter().find(|(name, _, _)| *name == path.as_str()) {
        Some((_, content_type, body)) => Ok(page_file(content_type, body)),
        None => Err(ApiError::not_found(format!("Unknown route: GET {}", req.path()), "unknown_url")),
    };
    state.finish(&req, "/web", start, res)
}

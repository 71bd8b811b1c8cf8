//! Cross-origin access for web pages (`--cors-origin`). Without the flag no
//! CORS header is ever sent, so a browser lets no other site read an answer
//! or send the JSON POSTs the API takes.

use actix_cors::Cors;
use actix_web::http::{header, Method};

/// The CORS policy for `origins` (`*`: any origin); None when the list is empty.
pub fn policy(origins: &[String]) -> Option<Cors> {
    let origins: Vec<&str> = origins.iter().map(|o| o.trim().trim_end_matches('/')).filter(|o| !o.is_empty()).collect();
    if origins.is_empty() {
        return None;
    }
    // Any request header: the browser SDKs send their own (OpenAI's
    // x-stainless-*, Anthropic's x-api-key and anthropic-version), and a
    // preflight naming one not allowed fails before the POST (mlx_lm.server
    // allows any too). The origins are what the policy restricts.
    let base = Cors::default().allowed_methods([Method::GET, Method::POST]).allow_any_header().max_age(3600);
    Some(if origins.contains(&"*") { base.allow_any_origin() } else { origins.into_iter().fold(base, Cors::allowed_origin) })
}

/// Each origin must be `scheme://host[:port]`, as browsers send it.
pub fn check_origins(origins: &[String]) -> Result<(), String> {
    for o in origins.iter().map(|o| o.trim().trim_end_matches('/')).filter(|o| !o.is_empty() && *o != "*") {
        let ok = o.split_once("://").is_some_and(|(scheme, rest)| {
            !scheme.is_empty() && !rest.is_empty() && !rest.contains('/') && o.parse::<header::HeaderValue>().is_ok()
        });
        if !ok {
            return Err(format!("--cors-origin {o:?} is not an origin like https://app.example.com"));
        }
    }
    Ok(())
}

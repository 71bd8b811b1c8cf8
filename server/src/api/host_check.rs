//! The Host header check: a web page that makes its own domain resolve to
//! 127.0.0.1 (DNS rebinding) reaches the server under that domain's name, so
//! only names the operator expects are served. IP addresses are always fine:
//! a browser sends an IP-address Host only when the user typed that address.

use std::net::IpAddr;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, ResponseError};

use super::error::ApiError;
use super::AppState;

/// The host names requests may use (`--allowed-host`, the `--host` name, localhost).
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    names: Vec<String>,
    any: bool,
}

/// `Host` without its port, lower-cased, without a trailing dot, IPv6 brackets removed.
fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let name = match host.strip_prefix('[') {
        // [v6]:port
        Some(rest) => rest.split(']').next().unwrap_or("").to_string(),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_string(),
            _ => host,
        },
    };
    name.trim_end_matches('.').to_string()
}

impl AllowedHosts {
    /// `configured` names (`*` allows any) plus the name the server binds, if it is one.
    pub fn new(configured: &[String], bind_host: &str) -> AllowedHosts {
        let any = configured.iter().any(|h| h.trim() == "*");
        let mut names: Vec<String> = configured.iter().map(|h| host_name(h)).filter(|h| !h.is_empty() && h != "*").collect();
        names.push("localhost".into());
        names.push(host_name(bind_host));
        AllowedHosts { names, any }
    }

    /// Whether a request naming `host` is served.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_name(host);
        self.any || name.parse::<IpAddr>().is_ok() || self.names.contains(&name)
    }
}

/// Middleware: 403 (the API's error JSON) for a Host that is not allowed. A
/// request without a Host (HTTP/1.0 tools) is served: browsers always send one.
pub async fn reject_unknown_hosts(req: ServiceRequest, next: Next<impl MessageBody + 'static>) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let host = req.headers().get("host").map(|h| h.to_str().unwrap_or("\u{fffd}").to_string());
    let state = req.app_data::<web::Data<AppState>>().cloned();
    if let (Some(host), Some(state)) = (host, state) {
        if !state.allowed_hosts.allows(&host) {
            let e = ApiError::forbidden(
                format!("Host {host:?} is not served here; start the server with --allowed-host NAME to allow it"),
                "host_not_allowed",
            );
            state.metrics.record_request("forbidden_host", e.status.as_u16());
            log::warn!("refused a request for Host {host:?}");
            return Ok(req.into_response(e.error_response()).map_into_right_body());
        }
    }
    Ok(next.call(req).await?.map_into_left_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_ip_addresses_and_configured_names_are_allowed() {
        let hosts = AllowedHosts::new(&["api.example.com".into()], "0.0.0.0");
        for ok in ["localhost", "LOCALHOST:5413", "127.0.0.1:5413", "[::1]:5413", "10.0.0.7", "api.example.com.", "Api.Example.com:80"] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in ["evil.example", "localhost.evil.example:5413", "api.example.com.evil", "", "127.0.0.1.nip.io"] {
            assert!(!hosts.allows(bad), "{bad}");
        }
        assert!(AllowedHosts::new(&[], "myhost").allows("myhost:5413"), "the name the server binds");
        assert!(AllowedHosts::new(&["*".into()], "127.0.0.1").allows("anything.example"));
    }
}

//! The API key (`--api-key`): who may call the API, compared in constant time
//! so the time an answer takes says nothing about how much of a guess was right.

use actix_web::HttpRequest;
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// What a request's credentials allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No key is configured, or the request carries it.
    Granted,
    /// A key is configured and the request sends no credentials at all.
    Anonymous,
}

/// The configured key, if any.
pub struct ApiKey(Option<String>);

impl ApiKey {
    /// An empty key counts as none.
    pub fn new(key: Option<String>) -> ApiKey {
        ApiKey(key.filter(|k| !k.is_empty()))
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// The request's access; 401 for a wrong key.
    pub fn access(&self, req: &HttpRequest) -> Result<Access, ApiError> {
        let Some(key) = &self.0 else { return Ok(Access::Granted) };
        // `Authorization: Bearer` (OpenAI's clients) or `x-api-key` (Anthropic's).
        let headers = req.headers();
        let given = match (headers.get("authorization"), headers.get("x-api-key")) {
            (Some(h), _) => h.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim).unwrap_or(""),
            (None, Some(h)) => h.to_str().unwrap_or("").trim(),
            (None, None) => return Ok(Access::Anonymous),
        };
        // Lengths may differ; ct_eq then answers false without comparing bytes
        // (the key's length is all that could leak).
        if bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            Ok(Access::Granted)
        } else {
            Err(ApiError::unauthorized("Incorrect API key provided"))
        }
    }

    /// 401 unless the request carries the key (when one is set).
    pub fn require(&self, req: &HttpRequest) -> Result<(), ApiError> {
        match self.access(req)? {
            Access::Granted => Ok(()),
            Access::Anonymous => Err(ApiError::unauthorized("Missing API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`")),
        }
    }
}

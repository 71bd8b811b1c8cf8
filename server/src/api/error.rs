//! Errors as OpenAI sends them: `{"error": {"message", "type", "param", "code"}}`
//! with the HTTP status that says whose fault it was; on the Anthropic routes,
//! as Anthropic sends them: `{"type": "error", "error": {"type", "message"}}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

/// What a request cut by the shutdown is told.
pub const SHUTTING_DOWN: &str = "the server is shutting down; the request was stopped";

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
    /// Seconds, for 503 (the `Retry-After` header).
    retry_after: Option<u32>,
    /// Close the connection after this answer (the rest of the body is never read).
    close: bool,
    style: ErrorStyle,
}

/// Whose error JSON a route answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorStyle {
    #[default]
    OpenAi,
    Anthropic,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None, close: false, style: ErrorStyle::OpenAi }
    }

    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending field.
    pub fn bad_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::bad_request(message) }
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("invalid_api_key"), ..ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message) }
    }

    /// 403: the request may not be served at all (e.g. an unexpected Host).
    pub fn forbidden(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError { code: Some(code), ..ApiError::new(StatusCode::FORBIDDEN, "invalid_request_error", message) }
    }

    /// 415: a POST body that does not say it is JSON.
    pub fn not_json(content_type: Option<&str>) -> ApiError {
        let got = content_type.map(|c| format!("got {c:?}")).unwrap_or_else(|| "none was sent".into());
        ApiError {
            code: Some("unsupported_media_type"),
            ..ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!("the request body must be JSON with `Content-Type: application/json` ({got})"),
            )
        }
    }

    /// 408: the body did not arrive in time; the connection is closed.
    pub fn body_timeout(seconds: u64) -> ApiError {
        ApiError {
            close: true,
            code: Some("request_timeout"),
            ..ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!("the request body did not arrive within {seconds} s"),
            )
        }
    }

    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError { code: Some(code), ..ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message) }
    }

    /// `served`: every name the model answers to.
    pub fn model_not_found(model: &str, served: &[String]) -> ApiError {
        let names = served.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        ApiError {
            param: Some("model".into()),
            ..ApiError::not_found(format!("The model `{model}` does not exist; this server serves {names}"), "model_not_found")
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
    }

    pub fn overloaded(queued: usize) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("the server is busy ({queued} requests waiting); retry later"),
            )
        }
    }

    /// 503: the server stopped this request because it is shutting down.
    pub fn shutting_down() -> ApiError {
        ApiError {
            code: Some("server_shutting_down"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", SHUTTING_DOWN)
        }
    }

    /// 503: the engine has stopped (its distributed group broke down, or the
    /// server is stopping); the server is on its way out.
    pub fn engine_stopped(why: Option<String>) -> ApiError {
        let message = match why {
            Some(why) => format!("the engine has stopped: {why}"),
            None => "the engine has stopped".to_string(),
        };
        ApiError { code: Some("engine_stopped"), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message) }
    }

    /// 500: the engine failed on this request (the server keeps serving).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The same error, answered in `style`'s JSON.
    pub fn in_style(self, style: ErrorStyle) -> ApiError {
        ApiError { style, ..self }
    }

    pub fn body(&self) -> serde_json::Value {
        match self.style {
            ErrorStyle::OpenAi => json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}),
            ErrorStyle::Anthropic => json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}}),
        }
    }

    /// Anthropic's error types, by status.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status);
        if let Some(s) = self.retry_after {
            res.insert_header(("Retry-After", s.to_string()));
        }
        if self.close {
            res.force_close();
        }
        res.json(self.body())
    }
}

/// Errors met while preparing a request: the request's content (its fields,
/// template and tokenizer failures) is the client's fault (400); anything
/// else — an invariant, MLX, a model file — is the server's (500).
impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> ApiError {
        use crate::error::Error;
        match e {
            Error::InvalidParam { param, message } => ApiError::bad_param(param, message),
            Error::Template(_) | Error::Tokenizer(_) => ApiError::bad_request(e.to_string()),
            other => ApiError::internal(other.to_string()),
        }
    }
}

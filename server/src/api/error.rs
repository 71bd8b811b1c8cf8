//! Errors as OpenAI sends them: `{"error": {"message", "type", "param", "code"}}`
//! with the HTTP status that says whose fault it was.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
    /// Seconds, for 503 (the `Retry-After` header).
    retry_after: Option<u32>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
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

    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError { code: Some(code), ..ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message) }
    }

    pub fn model_not_found(model: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            ..ApiError::not_found(format!("The model `{model}` does not exist; this server serves `{served}`"), "model_not_found")
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

    /// 500: the engine failed on this request (the server keeps serving).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
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

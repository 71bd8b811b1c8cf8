//! The server crate's error type. Each variant names the file, field or tensor
//! at fault, so a user can act on the message.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model file (config, tokenizer, weights index) is missing or malformed.
    #[error("{file}: {message}")]
    ModelFile { file: String, message: String },
    /// The chat template failed to render (including `raise_exception` from the template).
    #[error("chat template: {0}")]
    Template(String),
    /// Tokenizing or detokenizing failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The request or the command line asked for something impossible.
    #[error("{0}")]
    InvalidRequest(String),
    /// Downloading or resolving a model failed.
    #[error("model {model}: {message}")]
    Hub { model: String, message: String },
    #[error(transparent)]
    Mlx(#[from] mlx_rs_safe::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn model_file(file: &Path, message: impl Into<String>) -> Error {
        Error::ModelFile { file: file.display().to_string(), message: message.into() }
    }
}

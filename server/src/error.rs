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
    /// One field of the request has a value that cannot be used (400 naming it).
    #[error("{message}")]
    InvalidParam { param: &'static str, message: String },
    /// A command-line flag or setting cannot be used.
    #[error("{0}")]
    Config(String),
    /// The server could not start: binding the port, starting a thread.
    #[error("{0}")]
    Startup(String),
    /// An invariant of the code itself failed: a bug, never the client's fault (500).
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// The engine failed while generating (an MLX error in a step).
    #[error("generation failed: {0}")]
    Engine(String),
    /// Downloading or resolving a model failed.
    #[error("model {model}: {message}")]
    Hub { model: String, message: String },
    /// The shutdown's grace period ended with requests still running; they
    /// were cut short (the exit status says so).
    #[error("the shutdown cut {0} request(s) short")]
    CutAtShutdown(usize),
    #[error(transparent)]
    Mlx(#[from] mlx_rs_safe::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn model_file(file: &Path, message: impl Into<String>) -> Error {
        Error::ModelFile { file: file.display().to_string(), message: message.into() }
    }
}

//! The names a client may put in a request's `model`: the served id (the
//! first `--served-model-name`, else `--model` as given), every other
//! `--served-model-name`, the model's folder or repo basename, its local path,
//! and `default_model` (what some clients send when they have no name). Any
//! other name gets 404 listing these.

use std::path::{Path, PathBuf};

use super::error::ApiError;

#[derive(Debug, Clone)]
pub struct ModelNames {
    /// What responses and /v1/models call the model.
    pub id: String,
    /// Every name accepted, `id` first; listed by /v1/models.
    pub names: Vec<String>,
    dir: PathBuf,
}

impl ModelNames {
    /// `id`: the model's name without `--served-model-name` (`--model` as
    /// given: a folder, a .gguf file or a repo id); `dir`: where it was
    /// resolved to; `served`: the `--served-model-name`s.
    pub fn new(id: &str, dir: &Path, served: &[String]) -> ModelNames {
        let basename = id.trim_end_matches('/').rsplit('/').next().unwrap_or(id);
        let mut names: Vec<String> = Vec::new();
        for name in served.iter().map(String::as_str).chain([id, basename]) {
            let name = name.trim();
            if !name.is_empty() && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        ModelNames { id: names[0].clone(), names, dir: dir.to_path_buf() }
    }

    /// Ok for a served name, no name, or `default_model`; else 404.
    pub fn check(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None | Some("") | Some("default_model") => Ok(()),
            Some(m) if self.names.iter().any(|n| n == m) || Path::new(m) == self.dir => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m, &self.names)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_names_come_first_then_the_model_as_given_and_its_basename() {
        let n = ModelNames::new("mlx-community/Qwen3-4B-4bit", Path::new("/cache/snap/abc"), &["qwen".into(), "gpt-4o".into()]);
        assert_eq!(n.id, "qwen");
        assert_eq!(n.names, ["qwen", "gpt-4o", "mlx-community/Qwen3-4B-4bit", "Qwen3-4B-4bit"]);
        for ok in [None, Some(""), Some("default_model"), Some("gpt-4o"), Some("Qwen3-4B-4bit"), Some("/cache/snap/abc")] {
            assert!(n.check(ok).is_ok(), "{ok:?}");
        }
        let e = n.check(Some("llama")).unwrap_err();
        assert_eq!(e.status.as_u16(), 404);
        assert!(e.message.contains("`llama`") && e.message.contains("`Qwen3-4B-4bit`"), "{}", e.message);
    }

    #[test]
    fn without_served_names_the_model_as_given_is_the_id() {
        let n = ModelNames::new("/models/SmolLM2/", Path::new("/models/SmolLM2"), &[]);
        assert_eq!(n.id, "/models/SmolLM2/");
        assert_eq!(n.names, ["/models/SmolLM2/", "SmolLM2"]);
        assert!(n.check(Some("/models/SmolLM2")).is_ok());
    }
}

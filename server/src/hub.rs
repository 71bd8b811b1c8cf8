//! Model resolution: a local model directory, or a Hugging Face repo id ("org/name") whose
//! needed files are downloaded into the standard Hugging Face cache
//! (`<cache>/models--org--name/snapshots/<commit>/`), the one huggingface_hub and mlx-lm use,
//! so a model either of them already downloaded is reused, and the other way round.
//!
//! Downloads go through the `hf-hub` crate (sync API over ureq + rustls). What it lacks is
//! built around it here: the environment (`HF_HUB_CACHE`, `HF_TOKEN`, `HF_HUB_OFFLINE`),
//! offline use of the cache, falling back to the cache when the hub cannot be reached, file
//! selection, one progress bar for the whole model, and errors that name the repo.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::Progress;
use hf_hub::{Cache, Repo, RepoType};
use indicatif::{HumanBytes, HumanDuration, ProgressBar, ProgressStyle};

use crate::error::{Error, Result};

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
const DEFAULT_REVISION: &str = "main";

/// Top-level repo files a model needs, besides its `*.safetensors` weights. Everything else
/// (PyTorch `.bin`, GGUF, README, images, sub-folders) is never downloaded.
const NEEDED_FILES: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "model.safetensors.index.json",
];

/// Where and how to look for models. `Default` is the public hub, the default cache, no token,
/// online, branch `main`; [`HubOptions::from_env`] reads the variables huggingface_hub reads.
#[derive(Debug, Clone, Default)]
pub struct HubOptions {
    /// Hub URL (`HF_ENDPOINT`); `None`: <https://huggingface.co>.
    pub endpoint: Option<String>,
    /// The hub cache folder (`HF_HUB_CACHE`); `None`: [`default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Access token for gated or private repos (`HF_TOKEN`).
    pub token: Option<String>,
    /// Use only what is cached, never the network (`HF_HUB_OFFLINE`).
    pub offline: bool,
    /// Branch, tag or commit; `None`: `main`.
    pub revision: Option<String>,
}

impl HubOptions {
    /// Options from `HF_ENDPOINT`, `HF_HUB_CACHE` / `HF_HOME`, `HF_TOKEN` (else the token file
    /// `huggingface-cli login` writes) and `HF_HUB_OFFLINE`.
    pub fn from_env() -> HubOptions {
        let token = env_nonempty("HF_TOKEN")
            .or_else(|| env_nonempty("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = env_nonempty("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .or_else(|| hf_home().map(|home| home.join("token")))?;
                let token = std::fs::read_to_string(path).ok()?;
                Some(token.trim().to_string()).filter(|t| !t.is_empty())
            });
        let offline = env_nonempty("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        HubOptions {
            endpoint: env_nonempty("HF_ENDPOINT"),
            cache_dir: default_cache_dir(),
            token,
            offline,
            revision: None,
        }
    }

    fn endpoint_url(&self) -> &str {
        self.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT).trim_end_matches('/')
    }
}

/// The hub cache as huggingface_hub finds it: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`. `None` only when no home directory is known.
pub fn default_cache_dir() -> Option<PathBuf> {
    env_nonempty("HF_HUB_CACHE")
        .or_else(|| env_nonempty("HUGGINGFACE_HUB_CACHE"))
        .map(PathBuf::from)
        .or_else(|| hf_home().map(|home| home.join("hub")))
}

fn hf_home() -> Option<PathBuf> {
    if let Some(home) = env_nonempty("HF_HOME") {
        return Some(home.into());
    }
    let cache = env_nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env_nonempty("HOME").map(|home| Path::new(&home).join(".cache")))?;
    Some(cache.join("huggingface"))
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether a top-level repo file is one a model needs (see `NEEDED_FILES`).
pub fn is_needed_file(name: &str) -> bool {
    !name.contains('/') && (NEEDED_FILES.contains(&name) || name.ends_with(".safetensors"))
}

/// The model folder for `model`: an existing local directory or GGUF file (canonicalized), or the cache
/// snapshot of the Hugging Face repo `model`, downloading the needed files that are missing.
pub fn resolve(model: &str, opts: &HubOptions) -> Result<PathBuf> {
    let looks_like_path = model.starts_with(['/', '~'])
        || model.starts_with("./")
        || model.starts_with("../")
        || model == "."
        || model == "..";
    let path = expand_tilde(model);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => {
            return path.canonicalize().map_err(|e| Error::model_file(&path, e.to_string()))
        }
        // A file must be GGUF (locate says why not otherwise).
        Ok(_) => {
            crate::gguf::locate(&path)?;
            return path.canonicalize().map_err(|e| Error::model_file(&path, e.to_string()));
        }
        Err(e) if looks_like_path || e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::model_file(&path, format!("cannot open the model directory: {e}")))
        }
        Err(_) => {}
    }
    let hub_err = |message: String| Error::Hub { model: model.to_string(), message };
    if !is_repo_id(model) {
        return Err(hub_err(
            "neither a local directory nor a Hugging Face repo id (\"org/name\")".into(),
        ));
    }
    let revision = opts.revision.as_deref().unwrap_or(DEFAULT_REVISION);
    if revision.is_empty() || revision.split('/').any(|part| part.is_empty() || part == "..") {
        return Err(hub_err(format!("invalid revision {revision:?}")));
    }
    let cache_dir = match &opts.cache_dir {
        Some(dir) => dir.clone(),
        None => default_cache_dir().ok_or_else(|| {
            hub_err("no home directory to find the Hugging Face cache in: set HF_HUB_CACHE".into())
        })?,
    };
    // hf-hub makes relative symlinks from snapshots to blobs: give it an absolute root.
    let cache_dir = std::path::absolute(&cache_dir).unwrap_or(cache_dir);
    let repo_dir = cache_dir.join(format!("models--{}", model.replace('/', "--")));

    if opts.offline {
        return cached_snapshot(&repo_dir, revision).map_err(|why| {
            hub_err(format!(
                "offline (HF_HUB_OFFLINE) and {why}; download it once with network access, \
                 or pass a local model directory"
            ))
        });
    }
    let download = Download { model, revision, endpoint: opts.endpoint_url(), repo_dir: &repo_dir };
    download.run(&cache_dir, opts.token.clone()).or_else(|failure| match failure {
        // Like huggingface_hub: when the hub cannot be reached, use what is cached.
        Failure::Unreachable(message) => match cached_snapshot(&repo_dir, revision) {
            Ok(snapshot) => {
                eprintln!("warning: {model}: {message}; using the cached {}", snapshot.display());
                Ok(snapshot)
            }
            Err(why) => Err(hub_err(format!("{message}, and {why}"))),
        },
        Failure::Fatal(message) => Err(hub_err(message)),
    })
}

fn expand_tilde(model: &str) -> PathBuf {
    match (model.strip_prefix('~'), env_nonempty("HOME")) {
        (Some(""), Some(home)) => home.into(),
        (Some(rest), Some(home)) if rest.starts_with('/') => Path::new(&home).join(&rest[1..]),
        _ => model.into(),
    }
}

/// "name" or "org/name", each part of `[A-Za-z0-9._-]`, the hub's rules.
fn is_repo_id(model: &str) -> bool {
    let parts: Vec<&str> = model.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|part| {
            !part.is_empty()
                && part.len() <= 96
                && part.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                && !part.starts_with(['.', '-'])
                && !part.ends_with(['.', '-'])
                && !part.contains("--")
                && !part.contains("..")
        })
}

/// The cached snapshot for `revision` (a ref name, or a commit), if it holds a whole model;
/// else why not, to end an error message with.
fn cached_snapshot(repo_dir: &Path, revision: &str) -> std::result::Result<PathBuf, String> {
    let snapshots = repo_dir.join("snapshots");
    let by_commit = snapshots.join(revision);
    let snapshot = if revision.len() == 40 && by_commit.is_dir() {
        by_commit
    } else {
        let ref_file = repo_dir.join("refs").join(revision);
        match std::fs::read_to_string(&ref_file) {
            Ok(commit) if is_commit(commit.trim()) => snapshots.join(commit.trim()),
            _ => return Err(format!("it is not in the cache {}", repo_dir.display())),
        }
    };
    let has = |file: &str| snapshot.join(file).is_file();
    let index = snapshot.join("model.safetensors.index.json");
    let weights_ok = if index.is_file() {
        std::fs::read_to_string(&index)
            .ok()
            .and_then(|text| serde_json::from_str::<WeightIndex>(&text).ok())
            .is_some_and(|index| index.weight_map.values().all(|file| has(file)))
    } else {
        std::fs::read_dir(&snapshot).is_ok_and(|entries| {
            entries.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        })
    };
    if has("config.json") && weights_ok {
        Ok(snapshot)
    } else {
        Err(format!(
            "the cached {} is incomplete (config.json or weights missing)",
            snapshot.display()
        ))
    }
}

fn is_commit(text: &str) -> bool {
    !text.is_empty() && text.len() <= 64 && text.chars().all(|c| c.is_ascii_alphanumeric())
}

#[derive(serde::Deserialize)]
struct WeightIndex {
    weight_map: std::collections::HashMap<String, String>,
}

/// The hub's answer to `GET /api/models/{repo}/revision/{revision}?blobs=true`.
#[derive(serde::Deserialize)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(serde::Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
}

enum Failure {
    /// The hub could not be reached or failed (network, 5xx): the cache may stand in.
    Unreachable(String),
    /// The hub answered, and the answer rules the model out (not found, no weights, I/O).
    Fatal(String),
}

struct Download<'a> {
    model: &'a str,
    revision: &'a str,
    endpoint: &'a str,
    repo_dir: &'a Path,
}

impl Download<'_> {
    fn run(
        &self,
        cache_dir: &Path,
        token: Option<String>,
    ) -> std::result::Result<PathBuf, Failure> {
        if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
            return Err(Failure::Fatal(format!(
                "hub endpoint {:?} is not an http(s) URL",
                self.endpoint
            )));
        }
        let api = ApiBuilder::from_cache(Cache::new(cache_dir.to_path_buf()))
            .with_endpoint(self.endpoint.to_string())
            .with_token(token)
            .with_progress(false)
            .with_retries(3)
            .build()
            .map_err(|e| Failure::Fatal(format!("cannot set up the HTTP client: {e}")))?;
        let repo =
            Repo::with_revision(self.model.to_string(), RepoType::Model, self.revision.to_string());
        let info: RepoInfo = api
            .repo(repo)
            .info_request()
            .query("blobs", "true")
            .call()
            .map_err(|e| self.request_failure(e))?
            .into_json()
            .map_err(|e| Failure::Fatal(format!("bad repo info from {}: {e}", self.endpoint)))?;
        if !is_commit(&info.sha) {
            return Err(Failure::Fatal(format!(
                "bad commit id {:?} from {}",
                info.sha, self.endpoint
            )));
        }
        let files: Vec<&Sibling> =
            info.siblings.iter().filter(|s| is_needed_file(&s.rfilename)).collect();
        let has = |name: &str| files.iter().any(|s| s.rfilename == name);
        if !has("config.json") {
            return Err(Failure::Fatal(
                "the repo has no config.json: not a model in Hugging Face format".into(),
            ));
        }
        if !files.iter().any(|s| s.rfilename.ends_with(".safetensors")) {
            return Err(Failure::Fatal(
                "the repo has no .safetensors weights (the only format MLX loads)".into(),
            ));
        }
        let snapshot = self.repo_dir.join("snapshots").join(&info.sha);
        let missing: Vec<&Sibling> =
            files.into_iter().filter(|s| !snapshot.join(&s.rfilename).is_file()).collect();
        if !missing.is_empty() {
            // Pin every file to the commit the listing came from, as huggingface_hub does.
            let pinned = Repo::with_revision(self.model.into(), RepoType::Model, info.sha.clone());
            // hf-hub then writes refs/<commit>, which huggingface_hub never does: undo that.
            let stray_ref = self.repo_dir.join("refs").join(&info.sha);
            let had_ref = stray_ref.exists();
            let downloaded = self.download_files(&api.repo(pinned), &snapshot, &missing, &info.sha);
            if !had_ref {
                let _ = std::fs::remove_file(&stray_ref);
            }
            downloaded?;
        }
        if self.revision != info.sha {
            let ref_file = self.repo_dir.join("refs").join(self.revision);
            let written = ref_file
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&ref_file, &info.sha));
            written
                .map_err(|e| Failure::Fatal(format!("cannot write {}: {e}", ref_file.display())))?;
        }
        Ok(snapshot)
    }

    fn download_files(
        &self,
        repo: &ApiRepo,
        snapshot: &Path,
        files: &[&Sibling],
        sha: &str,
    ) -> std::result::Result<(), Failure> {
        let total: Option<u64> = files.iter().map(|s| s.size).sum();
        let bar = ProgressBar::new(total.unwrap_or(0));
        let template = "{msg:>24} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} \
                        {bytes_per_sec} ({eta})";
        bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        eprintln!(
            "Downloading {} @ {} ({} files{}) to {}",
            self.model,
            &sha[..sha.len().min(12)],
            files.len(),
            total.map(|t| format!(", {}", HumanBytes(t))).unwrap_or_default(),
            snapshot.display()
        );
        let start = Instant::now();
        let mut done = 0u64;
        for file in files {
            let target = snapshot.join(&file.rfilename);
            if target.symlink_metadata().is_ok() {
                // A dangling link from an interrupted download: hf-hub would not replace it.
                let _ = std::fs::remove_file(&target);
            }
            let progress = FileProgress { bar: bar.clone(), base: done, counted: total.is_some() };
            let result = catch_unwind(AssertUnwindSafe(|| {
                repo.download_with_progress(&file.rfilename, progress)
            }));
            let path = match result {
                Ok(Ok(path)) => path,
                Ok(Err(e)) => {
                    bar.abandon();
                    return Err(self.api_failure(&file.rfilename, e));
                }
                Err(_) => {
                    bar.abandon();
                    let message = format!(
                        "downloading {}: malformed answer from {}",
                        file.rfilename, self.endpoint
                    );
                    return Err(Failure::Fatal(message));
                }
            };
            if path != target {
                bar.abandon();
                return Err(Failure::Fatal(format!(
                    "{} came from another commit than {sha} ({}); run again",
                    file.rfilename,
                    path.display()
                )));
            }
            done += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            bar.set_position(done);
        }
        bar.finish_and_clear();
        eprintln!(
            "Downloaded {} ({}) in {}",
            self.model,
            HumanBytes(done),
            HumanDuration(start.elapsed())
        );
        Ok(())
    }

    fn request_failure(&self, error: ureq::Error) -> Failure {
        match error {
            ureq::Error::Status(status @ (401 | 403 | 404), response) => {
                let code = response.header("x-error-code").unwrap_or_default().to_string();
                let (model, endpoint, revision) = (self.model, self.endpoint, self.revision);
                Failure::Fatal(match code.as_str() {
                    "RevisionNotFound" => format!("revision {revision:?} not found on {endpoint}"),
                    "GatedRepo" => "gated repo: accept its terms on the hub, set HF_TOKEN".into(),
                    _ => format!(
                        "repository {model} not found on {endpoint} (HTTP {status}; \
                         if it is private or gated, set HF_TOKEN)"
                    ),
                })
            }
            ureq::Error::Status(status, response) => {
                let url = response.get_url().to_string();
                let message = format!("{} answered HTTP {status} for {url}", self.endpoint);
                if status >= 500 || status == 429 {
                    Failure::Unreachable(message)
                } else {
                    Failure::Fatal(message)
                }
            }
            ureq::Error::Transport(t) => {
                Failure::Unreachable(format!("cannot reach {}: {t}", self.endpoint))
            }
        }
    }

    fn api_failure(&self, file: &str, error: ApiError) -> Failure {
        match error {
            ApiError::RequestError(e) => match self.request_failure(*e) {
                Failure::Unreachable(m) => Failure::Unreachable(format!("downloading {file}: {m}")),
                Failure::Fatal(m) => Failure::Fatal(format!("downloading {file}: {m}")),
            },
            ApiError::TooManyRetries(e) => Failure::Unreachable(format!("downloading {file}: {e}")),
            ApiError::LockAcquisition(lock) => Failure::Fatal(format!(
                "downloading {file}: another process holds {}; wait for it, or remove the lock",
                lock.display()
            )),
            e => Failure::Fatal(format!("downloading {file}: {e}")),
        }
    }
}

/// Feeds hf-hub's per-file progress into the one bar of the whole download.
struct FileProgress {
    bar: ProgressBar,
    /// Bytes of the files before this one.
    base: u64,
    /// Whether this file's size is already in the bar's length.
    counted: bool,
}

impl Progress for FileProgress {
    fn init(&mut self, size: usize, filename: &str) {
        if !self.counted {
            self.bar.inc_length(size as u64);
            self.counted = true;
        }
        let name = filename.rsplit('/').next().unwrap_or(filename);
        let chars: Vec<char> = name.chars().collect();
        let short = match chars.len() {
            0..=24 => name.to_string(),
            n => format!("…{}", chars[n - 23..].iter().collect::<String>()),
        };
        self.bar.set_message(short);
        // Called again on each retry, before update(bytes already there): restart the file.
        self.bar.set_position(self.base);
    }

    fn update(&mut self, size: usize) {
        self.bar.inc(size as u64);
    }

    fn finish(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_follow_the_hub_rules() {
        for ok in ["gpt2", "mlx-community/Qwen3-0.6B-4bit", "org/name.v1_2"] {
            assert!(is_repo_id(ok), "{ok}");
        }
        for bad in
            ["", "a/b/c", "org/", "/name", "org/na me", "org/..", "org/-x", "a--b/c", "org/x."]
        {
            assert!(!is_repo_id(bad), "{bad}");
        }
    }

    #[test]
    fn only_model_files_are_needed() {
        for needed in [
            "config.json",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "chat_template.jinja",
        ] {
            assert!(is_needed_file(needed), "{needed}");
        }
        for skipped in [
            "pytorch_model.bin",
            "README.md",
            "original/model.safetensors",
            "model.gguf",
            ".gitattributes",
        ] {
            assert!(!is_needed_file(skipped), "{skipped}");
        }
    }
}

//! The default model: SmolLM2-135M-Instruct as the Q4_1 GGUF file ./build.sh
//! puts in vendor/models. Served without --model, it answers a factual
//! question right; it decodes mlx-lm 0.32.2's greedy tokens on an MLX folder
//! of the same weights (written by parity/gguf_to_mlx.py, apart from our
//! loader), and so does that folder through our loader; bad GGUF files are
//! refused with the file and the field named.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::engine::{drive, engine};
use common::server::TestServer;
use common::{python, repo};
use mlx_serve::models;
use mlx_serve::tokenizer::Tokenizer;
use serde_json::{json, Value};

fn default_model() -> PathBuf {
    let p = repo().join("vendor/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "no default model at {}: run ./build.sh", p.display());
    p
}

#[test]
fn the_anthropic_and_responses_routes_get_the_same_right_answer_from_the_default_model() {
    let server = TestServer::start_with(&[]);
    let question = "What is the capital of France?";
    let chat = server.post_json("/v1/chat/completions", &json!({"max_tokens": 32, "messages": [{"role": "user", "content": question}]}));
    let answer = chat.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(answer.contains("Paris"), "{answer:?}");
    // Greedy on every route: the same prompt, so the same words.
    let messages = server.post_json("/v1/messages", &json!({"max_tokens": 32, "temperature": 0, "messages": [{"role": "user", "content": question}]}));
    assert_eq!(messages.status, 200, "{}", messages.body);
    assert_eq!(messages.json()["content"][0]["text"], answer.as_str(), "{}", messages.body);
    let response = server.post_json("/v1/responses", &json!({"max_output_tokens": 32, "input": question}));
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.json()["output"][0]["content"][0]["text"], answer.as_str(), "{}", response.body);
}

#[test]
fn without_model_the_server_serves_smollm2_and_answers_right() {
    let server = TestServer::start_with(&[]);
    let models = server.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct", "{models}");
    let body = json!({"model": "SmolLM2-135M-Instruct", "max_tokens": 32,
                      "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let reply = server.post_json("/v1/chat/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(answer.contains("Paris"), "the default model answered {answer:?}");
    let health = server.get("/health").json();
    assert!(health.to_string().contains("SmolLM2"), "{health}");
}

/// mlx-lm's reference on the MLX copy of the default model (built once).
fn mlx_copy(question: &str, max_tokens: usize) -> (PathBuf, Value) {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-mlx");
    let run = Command::new(python())
        .arg(repo().join("parity/gguf_to_mlx.py"))
        .arg(default_model())
        .arg(&out)
        .arg(question)
        .arg(max_tokens.to_string())
        .current_dir(repo().join("parity"))
        .output()
        .unwrap();
    assert!(run.status.success(), "gguf_to_mlx.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
    let reference = serde_json::from_str(&std::fs::read_to_string(out.join("reference.json")).unwrap()).unwrap();
    (out, reference)
}

#[test]
fn the_gguf_file_and_its_mlx_copy_decode_mlx_lms_tokens() {
    let question = "Explain in two sentences why the sky is blue.";
    let (copy, r) = mlx_copy(question, 48);
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    let (prompt, tokens) = (ids(&r["prompt"]), ids(&r["tokens"]));
    assert!(tokens.len() >= 24, "a reference this short checks little: {r}");

    // Our tokenizer from the GGUF metadata renders and encodes the chat as
    // mlx-lm (transformers) does from the folder.
    let gguf = default_model();
    let tok = Tokenizer::load(&gguf, None).unwrap();
    assert_eq!(tok.encode_chat(&json!([{"role": "user", "content": question}]), None).unwrap(), prompt);

    let spec = json!({"prefill_size": 512});
    for dir in [&gguf, &copy] {
        let (mut e, _) = engine(dir, dir, &spec, &models::LoadOptions::default());
        let out = drive(&mut e, &[(&prompt, tokens.len())], &[0], None);
        assert_eq!(out[0].tokens, tokens, "{}: other tokens than mlx-lm ({})", dir.display(), r["text"]);
    }
    eprintln!("GGUF and MLX copy: mlx-lm's {} tokens: {}", tokens.len(), r["text"]);
}

/// The error loading `path` gives, model and tokenizer both.
fn load_errors(path: &Path) -> (String, String) {
    let model = models::load(path).err().map(|e| e.to_string()).unwrap_or_default();
    let tok = Tokenizer::load(path, None).err().map(|e| e.to_string()).unwrap_or_default();
    (model, tok)
}

#[test]
fn a_truncated_gguf_file_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(default_model()).unwrap();
    for (cut, what) in [(4 << 20, "truncated?"), (200_000, "run past the end")] {
        let path = dir.path().join(format!("cut{cut}.gguf"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let (model, tok) = load_errors(&path);
        for e in [&model, &tok] {
            assert!(e.contains(&path.display().to_string()) && e.contains(what), "{e}");
        }
    }
    let path = dir.path().join("not.gguf");
    std::fs::write(&path, b"{\"not\": \"gguf\"}").unwrap();
    assert!(load_errors(&path).0.contains("not a GGUF file"));
}

/// A GGUF file written by gguf's own writer: `arch`, the metadata `kv`
/// (key → [type, value]) and one float tensor.
fn write_gguf(path: &Path, arch: &str, kv: Value) {
    let script = r#"
import json, sys
import numpy as np
from gguf import GGUFWriter
path, arch, kv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
w = GGUFWriter(path, arch)
for key, (kind, value) in kv.items():
    getattr(w, "add_" + kind)(key, value)
w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
"#;
    let run = Command::new(python()).args(["-c", script]).arg(path).arg(arch).arg(kv.to_string()).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
}

#[test]
fn unsupported_architectures_and_missing_metadata_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mamba = dir.path().join("mamba.gguf");
    write_gguf(&mamba, "mamba", json!({}));
    let (model, _) = load_errors(&mamba);
    assert!(model.contains("mamba.gguf") && model.contains("general.architecture \"mamba\" is not supported") && model.contains("qwen3"), "{model}");

    // A llama file with its shape but no tokenizer, then no head count.
    let llama = json!({"llama.embedding_length": ["uint32", 64], "llama.block_count": ["uint32", 1],
                       "llama.feed_forward_length": ["uint32", 128], "llama.attention.head_count": ["uint32", 4],
                       "llama.attention.layer_norm_rms_epsilon": ["float32", 1e-5]});
    let no_tok = dir.path().join("notok.gguf");
    write_gguf(&no_tok, "llama", llama.clone());
    let (_, tok) = load_errors(&no_tok);
    assert!(tok.contains("notok.gguf") && tok.contains("tokenizer.ggml.model"), "{tok}");
    let mut partial = llama;
    partial.as_object_mut().unwrap().remove("llama.attention.head_count");
    let no_heads = dir.path().join("noheads.gguf");
    write_gguf(&no_heads, "llama", partial);
    let (model, _) = load_errors(&no_heads);
    assert!(model.contains("noheads.gguf") && model.contains("llama.attention.head_count"), "{model}");
}

// The server refuses to start on a bad file and says why, naming it.
#[test]
fn the_server_names_a_damaged_gguf_file_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.gguf");
    std::fs::write(&path, &std::fs::read(default_model()).unwrap()[..1 << 20]).unwrap();
    let out = Command::new(common::server::binary()).arg("--model").arg(&path).args(["--port", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("damaged.gguf") && err.contains("truncated?"), "{err}");
}

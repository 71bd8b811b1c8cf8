//! The memory plan against a real server: `--plan` prints it without loading
//! the weights, /health shows it, the context and the KV pool it chose are
//! respected, and a server in a memory cgroup plans within the cap and stays
//! inside it under a load that would not fit without the plan.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::server::{binary, TestServer};
use serde_json::{json, Value};

/// A model whose KV is large for its weights (32 layers of 16 KV heads of
/// 256: 512 KiB of KV a token at 16 bits, 1 MiB at this float32 model's 32),
/// so that memory runs out in KV first.
fn wide_kv_model() -> PathBuf {
    let config = json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 32, "intermediate_size": 64,
                        "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "rms_norm_eps": 1e-6,
                        "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": true,
                        "max_position_embeddings": 32768});
    common::fixture("plan_wide_kv", &json!({"config": config, "dtype": "float32", "quantize": null,
                                            "prompt_tokens": 8, "max_tokens": 4, "seed": 7}))
}

const MIB: u64 = 1 << 20;

fn plan_of(s: &TestServer) -> Value {
    s.get("/health").json()["memory_plan"].clone()
}

/// Everything the plan lets the server hold on the device, as it adds it up.
fn planned_total(p: &Value) -> f64 {
    let n = |k: &str| p[k].as_f64().unwrap_or(0.0);
    n("device_weight_bytes") + n("expert_cache_bytes") + n("kv_bytes_per_token") * n("kv_tokens") + n("prompt_cache_bytes") + n("reserve_bytes")
}

#[test]
fn plan_prints_the_plan_and_exits_without_reading_the_weights() {
    let model = wide_kv_model();
    // A copy whose weights are not a safetensors payload past the header: --plan
    // reads the header only.
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(&model).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let out = Command::new(binary())
        .args(["--model", dir.path().to_str().unwrap(), "--plan", "--memory-budget", "1g"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("memory plan: budget 1.00 GiB"), "{stdout}");
    let plan: Value = serde_json::from_str(&stdout[stdout.find('{').unwrap()..]).unwrap();
    assert_eq!(plan["budget_bytes"], 1u64 << 30);
    assert_eq!(plan["from_flags"], json!(["--memory-budget"]));
    // The model is float32, so its uncompressed cache holds 32-bit values (1 MiB
    // a token). 1 GiB cannot hold a whole 32K context uncompressed (32 GiB), nor
    // at 8 bits (9 GiB: a 32-bit scale and bias per 64 values); TurboQuant's
    // uncompressed prompt before compression (4096 tokens, 4 GiB) does not fit
    // either: 8-bit holds the most, and the context is cut to it.
    assert_eq!(plan["kv_element_bits"], 32, "{plan}");
    assert_eq!(plan["kv_format"], "kv8", "{plan}");
    assert_eq!(plan["kv_bytes_per_token"].as_f64(), Some(512.0 * 1024.0 * 9.0 / 16.0), "{plan}");
    assert_eq!(plan["context"], plan["kv_tokens"], "{plan}");
    assert!(planned_total(&plan) <= (1u64 << 30) as f64, "{plan}");
    // Too small a budget is a clear error, not a crash.
    let out = Command::new(binary()).args(["--model", model.to_str().unwrap(), "--plan", "--memory-budget", "100m"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("does not fit the memory plan's budget"), "{stderr}");
}

#[test]
fn the_server_keeps_to_the_context_and_the_kv_pool_it_planned() {
    let s = TestServer::start(&wide_kv_model(), &["--memory-budget", "900m", "--prompt-cache-bytes", "0"]);
    let plan = plan_of(&s);
    assert!(planned_total(&plan) <= (900 * MIB) as f64, "{plan}");
    assert_eq!(plan["from_flags"], json!(["--memory-budget", "--prompt-cache-bytes"]));
    let kv_tokens = plan["kv_tokens"].as_u64().unwrap();
    let context = plan["context"].as_u64().unwrap();
    assert!(context <= kv_tokens && context < 32768, "{plan}");
    assert_eq!(s.get("/health").json()["capabilities"]["context_length"], context);
    // A prompt over the planned context is refused, naming it.
    let r = s.post_json("/v1/completions", &json!({"prompt": vec![1; context as usize], "max_tokens": 1}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains(&format!("maximum context length is {context} tokens")), "{}", r.body);
    // Requests reserving a bit under half the pool each: two run at once, the others wait.
    let each = (kv_tokens / 2 / 256 * 256 - 16) as usize;
    let streams: Vec<_> = (0..4)
        .map(|_| s.send_raw_post("/v1/completions", &json!({"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": each, "ignore_eos": true, "stream": true}).to_string()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let e = s.get("/health").json()["engine"].clone();
        assert!(e["running"].as_u64().unwrap() <= 2, "more sequences than the KV pool holds: {e}");
        if e["running"] == 2 && e["queued"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "never two running and two waiting: {e}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(streams);
}

#[test]
fn a_sequence_ends_at_the_context_length() {
    let s = TestServer::start(&wide_kv_model(), &["--context-length", "40"]);
    assert_eq!(plan_of(&s)["context"], 40);
    // Without max_tokens, the sequence may take the rest of the context.
    let r = s.post_json("/v1/completions", &json!({"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "ignore_eos": true}));
    let body = r.json();
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 30, "{body}");
}

/// A memory cgroup (v1 or v2) this test may create, with `limit` bytes;
/// removed on drop.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn create(limit: u64) -> Option<Cgroup> {
        let name = format!("mlx-serve-test-{}", std::process::id());
        let (dir, limit_file, v2) = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (Path::new("/sys/fs/cgroup").join(&name), "memory.max", true)
        } else {
            (Path::new("/sys/fs/cgroup/memory").join(&name), "memory.limit_in_bytes", false)
        };
        std::fs::create_dir(&dir).ok()?;
        let g = Cgroup { dir, v2 };
        std::fs::write(g.dir.join(limit_file), limit.to_string()).ok()?;
        Some(g)
    }

    fn read(&self, v1: &str, v2: &str) -> u64 {
        let f = if self.v2 { v2 } else { v1 };
        std::fs::read_to_string(self.dir.join(f)).unwrap().trim().parse().unwrap()
    }

    /// The highest usage so far (v2 without memory.peak: the current one).
    fn peak(&self) -> u64 {
        if self.v2 {
            std::fs::read_to_string(self.dir.join("memory.peak")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or_else(|| self.read("", "memory.current"))
        } else {
            self.read("memory.max_usage_in_bytes", "")
        }
    }

    /// A command that runs the server inside the group.
    fn command(&self) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", &format!("echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"", self.dir.display()), &binary()]);
        c
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The server has exited (TestServer drops first); retry while the kernel lets go of it.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn under_a_memory_cgroup_the_plan_fits_the_cap_and_the_server_stays_inside_it() {
    let model = wide_kv_model();
    let limit = 1200 * MIB;
    let Some(group) = Cgroup::create(limit) else {
        eprintln!("SKIPPED: this machine gives no writable memory cgroup (needs root and cgroupfs)");
        return;
    };
    let s = TestServer::start_by(group.command(), &["--model", model.to_str().unwrap()]);
    let plan = plan_of(&s);
    assert_eq!(plan["budget_source"], "the cgroup's memory limit", "{plan}");
    let budget = plan["budget_bytes"].as_u64().unwrap();
    assert!(budget < limit && planned_total(&plan) <= budget as f64, "{plan}");
    // 16 requests, each a cache of 256 tokens (its allocation step) of 512 KiB:
    // 2 GiB of KV at 16 bits, far past the cap, if they all ran at once.
    let prompt: Vec<u32> = (0..40).map(|i| 1 + i % 500).collect();
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (base, prompt) = (s.base.clone(), prompt.clone());
            std::thread::spawn(move || {
                ureq::post(&format!("{base}/v1/completions"))
                    .send_json(json!({"prompt": prompt, "max_tokens": 8, "ignore_eos": true}))
                    .map(|r| r.into_json::<Value>().unwrap())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    for h in handles {
        let body = h.join().unwrap().unwrap_or_else(|e| panic!("a request failed under the cap: {e}\n{plan}"));
        assert_eq!(body["usage"]["completion_tokens"], 8, "{body}");
    }
    // The cgroup counts the page cache of the files the server read (reclaimable);
    // the server's own peak resident memory is what the plan answers for.
    let (peak, resident_peak) = (group.peak(), s.proc_status_kib("VmHWM") << 10);
    eprintln!(
        "cgroup limit {} MiB, budget {} MiB, server peak resident {} MiB, cgroup peak {} MiB; plan {plan}",
        limit / MIB,
        budget / MIB,
        resident_peak / MIB,
        peak / MIB
    );
    assert!(resident_peak <= budget, "the server's peak resident memory ({resident_peak} bytes) passed its budget ({budget})");
    assert!(peak <= limit);
    drop(s);
}

#[test]
fn layers_past_gpu_layers_give_the_same_greedy_tokens() {
    let model = common::models::model();
    let body = json!({"prompt": "the model", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "logprobs": 1});
    let answer = |flags: &[&str]| {
        let s = TestServer::start(&model, flags);
        let r = s.post_json("/v1/completions", &body).json();
        (r["choices"][0]["text"].clone(), r["choices"][0]["logprobs"]["tokens"].clone(), plan_of(&s))
    };
    let (text, tokens, plan) = answer(&[]);
    assert_eq!(plan["gpu_layers"], Value::Null);
    assert_eq!(tokens.as_array().map(Vec::len), Some(24), "{tokens}");
    for n in ["0", "1"] {
        let (t, ids, plan) = answer(&["--gpu-layers", n]);
        assert_eq!((&t, &ids), (&text, &tokens), "--gpu-layers {n}");
        assert_eq!(plan["gpu_layers"], n.parse::<u64>().unwrap());
        assert_eq!(plan["from_flags"], json!(["--gpu-layers"]));
    }
}

//! One model over several `mlx-serve` processes: ranks of one MLX group on
//! localhost over the ring backend (MLX_RANK and MLX_HOSTFILE, as
//! `mlx.launch` sets them). Rank 0 serves HTTP; the answers must be the
//! tokens mlx-lm gives in one process (the fixture's reference), in tensor
//! and pipeline modes, for dense and MoE models, with requests batched.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::configs::{gemma4, gemma4_moe, gpt_oss, llama, qwen3_5_moe, qwen3_moe, qwen3_next, spec};
use common::fixture;
use common::server::{binary, TestServer};
use mlx_serve::metrics;
use serde_json::{json, Value};

/// Ranks 1.. of a group, and rank 0's server.
struct Cluster {
    server: TestServer,
    followers: Vec<Child>,
    /// Where follower r's stderr goes (followers[r - 1]).
    logs: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

/// A port for one rank's ring connections, free when chosen: below the
/// kernel's ephemeral range (32768 up), where no `--port 0` server and no
/// outgoing connection's source port can take it before its rank binds it,
/// and never one that another group of this run was given (groups of
/// concurrent tests dialing each other's ranks fail one test and hang the
/// other). The start depends on the process id, so two runs at once seldom meet.
fn ring_port() -> u16 {
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(2_654_435_761) % COUNT;
    loop {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % COUNT) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A hostfile in `dir` for `ranks` ranks on localhost, a ring port each.
fn write_hostfile(dir: &Path, ranks: usize) -> PathBuf {
    let hostfile = dir.join("hosts.json");
    let hosts: Vec<Value> = (0..ranks).map(|_| json!([format!("127.0.0.1:{}", ring_port())])).collect();
    std::fs::write(&hostfile, Value::Array(hosts).to_string()).unwrap();
    hostfile
}

impl Cluster {
    /// Starts `ranks` processes serving `model` in `mode` (tensor|pipeline).
    fn start(model: &Path, ranks: usize, mode: &str, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let hostfile = write_hostfile(dir.path(), ranks);
        let mut flags = vec!["--model", model.to_str().unwrap(), "--distributed", mode];
        flags.extend_from_slice(extra);
        let mut followers = Vec::new();
        let mut logs = Vec::new();
        for rank in 1..ranks {
            let log = dir.path().join(format!("rank{rank}.log"));
            followers.push(
                Command::new(binary())
                    .env_remove("MLX_SERVE_MODEL")
                    .env("MLX_RANK", rank.to_string())
                    .env("MLX_HOSTFILE", &hostfile)
                    .args(["--port", "0", "--log-level", "info"])
                    .args(&flags)
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap(),
            );
            logs.push(log);
        }
        let mut rank0 = Command::new(binary());
        rank0.env("MLX_RANK", "0").env("MLX_HOSTFILE", &hostfile);
        let server = TestServer::start_by(rank0, &flags);
        Cluster { server, followers, logs, _dir: dir }
    }

    /// Every rank's process id, rank 0's first.
    fn pids(&self) -> Vec<u32> {
        std::iter::once(self.server.pid()).chain(self.followers.iter().map(Child::id)).collect()
    }

    fn follower_log(&self, rank: usize) -> String {
        std::fs::read_to_string(&self.logs[rank - 1]).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for f in &mut self.followers {
            let _ = f.kill();
            let _ = f.wait();
        }
        // A failed test shows what the ranks said: their logs go with the group.
        if std::thread::panicking() {
            let logs = std::iter::once(self.server.stderr().join("\n")).chain((1..=self.followers.len()).map(|r| self.follower_log(r)));
            for (rank, log) in logs.enumerate() {
                let lines: Vec<&str> = log.lines().collect();
                eprintln!("rank {rank}'s log, last lines:\n{}", lines[lines.len().saturating_sub(30)..].join("\n"));
            }
        }
    }
}

/// The fixture's mlx-lm reference: its prompt, and the text of its greedy tokens.
fn reference(dir: &Path) -> (Vec<u32>, usize, String) {
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = serde_json::from_value(reference["prompt"].clone()).unwrap();
    let expected: Vec<u32> = serde_json::from_value(reference["tokens"].clone()).unwrap();
    let tok = mlx_serve::tokenizer::Tokenizer::load(dir, None).unwrap();
    (prompt, expected.len(), tok.decode(&expected, true).unwrap())
}

/// The reference prompt three times among two other requests, all at once:
/// each of the three must be mlx-lm's text, and they must share batches.
/// Then the reference prompt alone (a prompt-cache hit) must be too.
fn check_matches_mlx_lm(name: &str, dir: &Path, ranks: usize, mode: &str, extra: &[&str]) -> Cluster {
    check_group(name, dir, ranks, mode, extra, true)
}

/// [`check_matches_mlx_lm`]; `repeat_hits`: whether repeating a prompt after
/// its answer hits the prompt cache (not where sliding windows moved on).
fn check_group(name: &str, dir: &Path, ranks: usize, mode: &str, extra: &[&str], repeat_hits: bool) -> Cluster {
    let (prompt, n, expected) = reference(dir);
    let mut flags = vec!["--prefill-size", "512"];
    flags.extend_from_slice(extra);
    let cluster = Cluster::start(dir, ranks, mode, &flags);
    assert_eq!(cluster.server.get("/health").json()["distributed"], json!({"mode": mode, "ranks": ranks}));
    let bodies = [
        json!({"prompt": prompt, "max_tokens": n, "ignore_eos": true}),
        json!({"prompt": "the model", "max_tokens": 40, "ignore_eos": true}),
        json!({"prompt": prompt, "max_tokens": n, "ignore_eos": true}),
        json!({"prompt": &prompt[..100], "max_tokens": 30, "ignore_eos": true, "temperature": 0.8, "seed": 3}),
        json!({"prompt": prompt, "max_tokens": n, "ignore_eos": true}),
    ];
    let texts = cluster.server.completions_at_once(&bodies);
    for i in [0, 2, 4] {
        assert_eq!(texts[i], expected, "{name} over {ranks} ranks ({mode}): request {i} differs from mlx-lm");
    }
    let m = cluster.server.metrics();
    let rows = metrics::counter_value(&m, "mlx_serve_decode_rows_total").unwrap();
    let steps = metrics::counter_value(&m, "mlx_serve_decode_steps_total").unwrap();
    assert!(rows / steps > 1.5, "{name}: mean batch size {} — the requests did not share a batch", rows / steps);
    // Seeded sampling is the same on every rank, and the same as in one process.
    let again = cluster.server.completions_at_once(&bodies[3..4]);
    assert_eq!(again[0], texts[3], "{name}: a seeded sample changed");
    let again = cluster.server.completions_at_once(&bodies[..1]);
    assert_eq!(again[0], expected, "{name}: the prompt-cache hit differs from mlx-lm");
    let m = cluster.server.metrics();
    let hits = metrics::counter_value(&m, "mlx_serve_prompt_cache_hits_total").unwrap();
    assert!(hits >= 1.0 || !repeat_hits, "{name}: the repeated prompt missed the prompt cache");
    // Every step was preceded by a turn sent to the group; 7 requests travelled in them.
    let turns = metrics::counter_value(&m, "mlx_serve_distributed_turns_total").unwrap();
    let turn_bytes = metrics::counter_value(&m, "mlx_serve_distributed_turn_bytes_total").unwrap();
    let steps = metrics::counter_value(&m, "mlx_serve_decode_steps_total").unwrap();
    assert!(turns >= steps, "{name}: {turns} turns for {steps} decode steps");
    assert!(turn_bytes > 7.0 * 600.0, "{name}: {turn_bytes} bytes of turns for 7 requests of up to 600 prompt tokens");
    eprintln!("{name} over {ranks} ranks ({mode}): mlx-lm's tokens, mean batch {:.2}", rows / steps);
    cluster
}

/// A llama with heads, KV heads and MLP columns that split over 4 ranks, and 4 layers.
fn dense_model() -> PathBuf {
    let mut c = llama();
    c["num_hidden_layers"] = json!(4);
    c["num_key_value_heads"] = json!(4);
    c["max_position_embeddings"] = json!(8192);
    fixture("distributed_llama_fp32", &spec(c, "float32", None))
}

/// A Qwen3 MoE (8 experts, top 2) that splits over 4 ranks, in float32
/// (MLX's CPU gather_mm takes nothing else) or 4-bit.
fn moe_model(quantize: Option<Value>) -> PathBuf {
    let mut c = qwen3_moe();
    c["num_hidden_layers"] = json!(4);
    c["num_key_value_heads"] = json!(4);
    let name = if quantize.is_some() { "distributed_qwen3_moe_q4" } else { "distributed_qwen3_moe_fp32" };
    fixture(name, &spec(c, "float32", quantize))
}

/// Bytes each rank must read from `model`'s safetensors file: in tensor mode
/// its part of each layer's matrices (the router and 1-D tensors whole), in
/// pipeline mode its layers whole; tensors outside the layers whole.
fn shard_bytes(model: &Path, ranks: usize, mode: &str, layers: usize) -> Vec<u64> {
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    (0..ranks)
        .map(|rank| {
            // mlx-lm's pipeline: the last rank runs the first layers.
            let (base, extra) = (layers / ranks, layers % ranks);
            let count = |r: usize| base + usize::from(r < extra);
            let start: usize = (rank + 1..ranks).map(count).sum();
            let mine = start..start + count(rank);
            meta.tensors()
                .iter()
                .map(|(name, info)| {
                    let size = (info.data_offsets.1 - info.data_offsets.0) as u64;
                    let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
                    match (layer, mode) {
                        (None, _) => size,
                        (Some(i), "pipeline") => if mine.contains(&i) { size } else { 0 },
                        (Some(_), _) if info.shape.len() < 2 || name.contains(".mlp.gate.") => size,
                        (Some(_), _) => size / ranks as u64,
                    }
                })
                .sum()
        })
        .collect()
}

/// Each rank read its shard's bytes from the files (the log says how many),
/// and the kernel counted about that many (rchar: reads, also page-cached).
fn check_reads(cluster: &Cluster, model: &Path, ranks: usize, mode: &str, layers: usize) {
    let expected = shard_bytes(model, ranks, mode, layers);
    let file = std::fs::metadata(model.join("model.safetensors")).unwrap().len();
    let tokenizer = std::fs::metadata(model.join("tokenizer.json")).map(|m| m.len()).unwrap_or(0);
    for (rank, pid) in cluster.pids().into_iter().enumerate() {
        if rank > 0 {
            let log = cluster.follower_log(rank);
            let said = format!("rank {rank} of {ranks} reads {} bytes", expected[rank]);
            assert!(log.contains(&said), "rank {rank}: expected '{said}' in its log:\n{log}");
        }
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
        let rchar: u64 = io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap();
        // What else a rank reads (tokenizer, configs, /proc): ~60 KiB here,
        // less than the part of the weights a rank must leave unread.
        let slack = tokenizer + (128 << 10);
        assert!(expected[rank] + slack < file, "the fixture is too small to tell a shard from the whole file");
        assert!(
            rchar >= expected[rank] && rchar <= expected[rank] + slack,
            "rank {rank} ({mode}): read {rchar} bytes, its shard is {} of the file's {file} (slack {slack})",
            expected[rank]
        );
        eprintln!("rank {rank} of {ranks} ({mode}): read {rchar} bytes; its shard {} of {file}", expected[rank]);
    }
}

#[test]
fn a_dense_model_over_2_and_4_ranks_in_tensor_mode_gives_mlx_lms_tokens() {
    let model = dense_model();
    for ranks in [2, 4] {
        let cluster = check_matches_mlx_lm("llama fp32", &model, ranks, "tensor", &[]);
        check_reads(&cluster, &model, ranks, "tensor", 4);
    }
}

/// Both ways a stage hands on: sends (what ring supports), and the
/// all-gathers a backend without sends (NCCL) gets.
#[test]
fn a_dense_model_over_2_and_4_ranks_in_pipeline_mode_gives_mlx_lms_tokens() {
    let model = dense_model();
    for (ranks, transfer) in [(2, "send"), (4, "send"), (2, "gather"), (4, "gather")] {
        let cluster = check_matches_mlx_lm("llama fp32", &model, ranks, "pipeline", &["--pipeline-transfer", transfer]);
        check_reads(&cluster, &model, ranks, "pipeline", 4);
    }
}

#[test]
fn a_moe_model_over_2_and_4_ranks_gives_mlx_lms_tokens_in_both_modes() {
    let model = moe_model(None);
    for (ranks, mode) in [(2, "tensor"), (4, "tensor"), (2, "pipeline"), (4, "pipeline")] {
        let cluster = check_matches_mlx_lm("qwen3_moe fp32", &model, ranks, mode, &[]);
        check_reads(&cluster, &model, ranks, mode, 4);
    }
}

/// Streamed experts in pipeline mode, decode steps speculating: each rank
/// streams its own layers' experts, a step's read-back ending each rank's
/// stage; the tokens stay mlx-lm's, alone and batched.
#[test]
fn a_moe_model_with_streamed_experts_over_2_ranks_in_pipeline_mode_speculates_and_gives_mlx_lms_tokens() {
    let model = moe_model(None);
    let flags = ["--stream-experts", "--expert-cache-bytes", "50%", "--expert-speculation", "on"];
    let cluster = check_matches_mlx_lm("qwen3_moe fp32, experts streamed", &model, 2, "pipeline", &flags);
    let experts = cluster.server.get("/health").json()["experts"].clone();
    for field in ["misses", "bytes_read", "speculative_steps"] {
        assert!(experts[field].as_u64().is_some_and(|v| v > 0), "rank 0: no {field}: {experts}");
    }
    eprintln!("rank 0's experts: {experts}");
}

#[test]
fn a_4bit_moe_model_is_sharded_without_dequantizing() {
    let model = moe_model(Some(json!({"bits": 4, "group_size": 32})));
    let cluster = check_matches_mlx_lm("qwen3_moe 4-bit", &model, 2, "tensor", &[]);
    check_reads(&cluster, &model, 2, "tensor", 4);
}

// gpt-oss: sliding-window and full layers, sinks, experts with biases. In
// pipeline mode (mxfp4) split by layers; in tensor mode (fp32: MLX's CPU
// gather_mm) each expert's gate/up biases split with its rows and the down
// bias divided among the ranks, as mlx-lm shards it.
#[test]
fn gpt_oss_over_2_ranks_gives_mlx_lms_tokens_in_both_modes() {
    let model = fixture("gpt_oss_mxfp4", &spec(gpt_oss(), "bfloat16", Some(json!({"bits": 4, "group_size": 32, "mode": "mxfp4"}))));
    // The repeated prompt misses: its answer moved the 128-token windows past it.
    check_group("gpt_oss mxfp4", &model, 2, "pipeline", &[], false);
    let model = fixture("gpt_oss_fp32", &spec(gpt_oss(), "float32", None));
    check_group("gpt_oss fp32", &model, 2, "tensor", &[], false);
}

// Qwen3.5-MoE: recurrent states beside attention, split by layers (its
// repeated prompt hits the state kept at the prompt's end), or by heads in
// tensor mode (as mlx-lm's Qwen3.5 `shard`: the fused q/k/v rows and the
// convolution's channels segment by segment), in float32 activations, where
// the ranks' partial sums cannot flip a near-tie (in bfloat16 they do, after
// the first token): float weights, and 4-bit ones with experts wide enough
// for their scale groups to split. Heads that do not divide are refused.
#[test]
fn qwen3_5_moe_over_2_ranks_gives_mlx_lms_tokens_in_both_modes() {
    let model = fixture("qwen3_5_moe_q4", &spec(qwen3_5_moe(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))));
    check_group("qwen3_5_moe 4-bit", &model, 2, "pipeline", &[], true);
    let model = fixture("qwen3_5_moe_fp32", &spec(qwen3_5_moe(), "float32", None));
    check_group("qwen3_5_moe fp32", &model, 2, "tensor", &[], true);
    every_rank_refuses(&model, 3, "tensor", &["3 ranks", "linear key heads", "--distributed pipeline"]);
    let mut wide = qwen3_5_moe();
    wide["text_config"]["moe_intermediate_size"] = json!(64);
    wide["text_config"]["shared_expert_intermediate_size"] = json!(64);
    let model = fixture("qwen3_5_moe_q4_fp32", &spec(wide, "float32", Some(json!({"bits": 4, "group_size": 32}))));
    check_group("qwen3_5_moe 4-bit", &model, 2, "tensor", &[], true);
}

// Qwen3-Next's interleaved projections ([q k v z] per key head) split by key heads.
#[test]
fn qwen3_next_over_2_ranks_in_tensor_mode_gives_mlx_lms_tokens() {
    let model = fixture("qwen3_next_fp32", &spec(qwen3_next(), "float32", None));
    check_group("qwen3_next fp32", &model, 2, "tensor", &[], true);
}

// Gemma 4 in pipeline mode: each rank its layers, the per-layer inputs
// computed on every rank from the tokens (float32: the batched rows of this
// fixture flip a near-tie in bfloat16, in one process too), the MoE block in
// 4-bit. A KV-shared layer whose source layer another rank would run is
// refused on every rank.
#[test]
fn gemma4_over_2_ranks_in_pipeline_mode_gives_mlx_lms_tokens() {
    let mut unshared = gemma4();
    unshared["num_kv_shared_layers"] = json!(0);
    let model = fixture("gemma4_unshared_fp32", &spec(unshared, "float32", None));
    // The repeated prompt misses: its answer moved the 128-token windows past it.
    check_group("gemma4 fp32", &model, 2, "pipeline", &[], false);
    let model = fixture("gemma4_moe_q4", &spec(gemma4_moe(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))));
    check_group("gemma4_moe 4-bit", &model, 2, "pipeline", &[], false);
    // 6 layers, the last 2 sharing: layer 5 (full) reads layer 2's cache, on the other rank.
    let shared = fixture("gemma4_fp32", &spec(gemma4(), "float32", None));
    every_rank_refuses(&shared, 2, "pipeline", &["layer 5", "layer 2", "fewer ranks"]);
}

// Gemma 4 in tensor mode: every layer's heads split (both head sizes, KV
// sharing and per-layer inputs on each rank), the MoE block's experts too,
// in float32; the MoE fixture's single global KV head is repeated on both
// ranks (its values are its keys). Query heads that do not divide: refused.
#[test]
fn gemma4_over_2_ranks_in_tensor_mode_gives_mlx_lms_tokens() {
    let shared = fixture("gemma4_fp32", &spec(gemma4(), "float32", None));
    check_group("gemma4 fp32", &shared, 2, "tensor", &[], false);
    let model = fixture("gemma4_moe_fp32", &spec(gemma4_moe(), "float32", None));
    check_group("gemma4_moe fp32", &model, 2, "tensor", &[], false);
    every_rank_refuses(&model, 3, "tensor", &["3 ranks", "4 query heads", "--distributed pipeline"]);
}

// More ranks than KV heads: each KV head is held by the ranks whose query
// heads attend to it (4 ranks, 4 query heads, 2 KV heads).
#[test]
fn kv_heads_fewer_than_the_ranks_are_repeated() {
    let mut c = llama();
    c["num_hidden_layers"] = json!(4);
    let model = fixture("distributed_llama_kv2_fp32", &spec(c, "float32", None));
    check_matches_mlx_lm("llama, 2 KV heads", &model, 4, "tensor", &[]);
}

/// A streamed request whose client goes away is cancelled on every rank in
/// the same turn: the group stays in step and answers the next requests.
#[test]
fn a_cancelled_stream_leaves_the_ranks_in_step() {
    let model = dense_model();
    let (prompt, n, expected) = reference(&model);
    let cluster = Cluster::start(&model, 2, "tensor", &["--prefill-size", "512"]);
    let body = json!({"prompt": "the model", "max_tokens": 4000, "ignore_eos": true, "stream": true}).to_string();
    for _ in 0..3 {
        let mut c = cluster.server.send_raw_post("/v1/completions", &body);
        let mut first = [0u8; 256];
        std::io::Read::read(&mut c, &mut first).unwrap();
        drop(c);
    }
    let texts = cluster.server.completions_at_once(&[json!({"prompt": prompt, "max_tokens": n, "ignore_eos": true})]);
    assert_eq!(texts[0], expected);
    let m = cluster.server.metrics();
    let generated = metrics::counter_value(&m, "mlx_serve_generated_tokens_total").unwrap();
    assert!(generated < 3.0 * 4000.0, "the dropped streams ran to the end ({generated} tokens)");
    assert_eq!(metrics::counter_value(&m, "mlx_serve_cancelled_total"), Some(3.0));
}

/// A rank that dies ends the group: the request in flight is answered 503
/// (engine_stopped, naming the broken group), and rank 0 exits with the
/// reason instead of hanging; so do the other ranks when rank 0 dies.
#[test]
fn killing_a_rank_answers_503_and_stops_the_others() {
    let model = dense_model();
    for mode in ["pipeline", "tensor"] {
        let mut cluster = Cluster::start(&model, 2, mode, &[]);
        let running = std::thread::scope(|scope| {
            let server = &cluster.server;
            let request = scope.spawn(move || {
                server.post_json("/v1/completions", &json!({"prompt": "the model", "max_tokens": 8000, "ignore_eos": true}))
            });
            // Kill rank 1 once decoding is under way.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let steps = metrics::counter_value(&server.metrics(), "mlx_serve_decode_steps_total").unwrap_or(0.0);
                if steps >= 20.0 {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "decoding did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            cluster.followers[0].kill().unwrap();
            request.join().unwrap()
        });
        assert_eq!(running.status, 503, "{mode}: {}", running.body);
        let error = &running.json()["error"];
        assert_eq!(error["code"], "engine_stopped", "{}", running.body);
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("distributed group") && message.contains("connection to a peer was lost"), "{message}");
        let status = cluster.server.wait_exit(Duration::from_secs(15)).expect("rank 0 did not exit after rank 1 died");
        assert_eq!(status.code(), Some(1), "{mode}: rank 0 exited with {status}");
        let stderr = cluster.server.stderr().join("\n");
        assert!(stderr.contains("distributed group"), "{stderr}");
    }
    // Rank 0 dies mid-request: the follower ends too.
    let mut cluster = Cluster::start(&model, 2, "tensor", &[]);
    let body = json!({"prompt": "the model", "max_tokens": 8000, "ignore_eos": true, "stream": true}).to_string();
    let mut c = cluster.server.send_raw_post("/v1/completions", &body);
    std::io::Read::read(&mut c, &mut [0u8; 256]).unwrap();
    assert!(Command::new("kill").args(["-KILL", &cluster.server.pid().to_string()]).status().unwrap().success());
    let follower = &mut cluster.followers[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = follower.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "rank 1 did not exit after rank 0 died");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1), "rank 1 exited with {status}");
    assert!(cluster.follower_log(1).contains("distributed group"), "{}", cluster.follower_log(1));
}

/// Flags that cannot work together are refused before any rank loads.
#[test]
fn tensor_mode_refuses_heads_that_do_not_split() {
    every_rank_refuses(&dense_model(), 3, "tensor", &["3 ranks", "heads"]);
}

/// Starts `ranks` ranks of `model` in `mode`: each must exit with an error
/// that names `words`.
fn every_rank_refuses(model: &Path, ranks: usize, mode: &str, words: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = write_hostfile(dir.path(), ranks);
    let children: Vec<Child> = (0..ranks)
        .map(|rank| {
            Command::new(binary())
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .args(["--model", model.to_str().unwrap(), "--port", "0", "--distributed", mode])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {rank} started");
        assert!(words.iter().all(|w| stderr.contains(w)), "rank {rank}: {stderr}");
    }
}

/// A structured-output request: every rank compiles the grammar rank 0 sends
/// and masks the same rows, so the sampled answer is the one process's.
#[test]
fn a_json_schema_request_gives_the_single_process_answer() {
    let model = common::models::model();
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                        "required": ["name", "n"], "additionalProperties": false});
    let body = json!({"messages": [{"role": "user", "content": "describe it"}], "max_tokens": 200, "temperature": 1.0, "seed": 11,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "out", "strict": true, "schema": schema}}});
    let answer = |server: &TestServer| {
        let r = server.post_json("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let reply = r.json();
        assert_eq!(reply["choices"][0]["finish_reason"], "stop", "{reply}");
        reply["choices"][0]["message"]["content"].as_str().unwrap().to_string()
    };
    let alone = answer(&TestServer::start(&model, &[]));
    let cluster = Cluster::start(&model, 2, "tensor", &[]);
    let grouped = answer(&cluster.server);
    assert_eq!(grouped, alone, "over 2 ranks the constrained sample differs");
    let value: Value = serde_json::from_str(&grouped).unwrap();
    assert!(value["name"].is_string() && value["n"].is_i64(), "{value}");
}

/// Bad distributed flags, and a hostfile that is not there, stop the start
/// with an error naming them.
#[test]
fn bad_distributed_flags_and_a_missing_hostfile_are_named() {
    let model = dense_model();
    let start = |env: &[(&str, &str)], flags: &[&str]| {
        let out = Command::new(binary())
            .envs(env.iter().copied())
            .args(["--model", model.to_str().unwrap(), "--port", "0"])
            .args(flags)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flags:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(start(&[], &["--distributed", "sideways"]).contains("--distributed must be tensor or pipeline (got \"sideways\")"));
    assert!(start(&[], &["--distributed-backend", "pigeon"]).contains("--distributed-backend must be any, ring, nccl, jaccl or mpi"));
    assert!(start(&[], &["--pipeline-transfer", "teleport"]).contains("--pipeline-transfer must be auto, send or gather"));
    let e = start(&[("MLX_RANK", "0"), ("MLX_HOSTFILE", "/nonexistent/hosts.json")], &[]);
    assert!(e.contains("cannot read MLX_HOSTFILE /nonexistent/hosts.json"), "{e}");
}


//! A process that loads a model with `--stream-experts` attends every prefill
//! chunk through MLX's fused kernel (`kv::attend_prefill_fused`): no scores
//! array beside a streamed model's expert cache. Its own test binary: the
//! setting is the process's.

use clap::Parser;
use mlx_serve::cli::Cli;
use mlx_serve::kv::unfused_prefill_keys;

#[test]
fn streaming_experts_makes_prefill_chunks_attend_through_the_fused_kernel() {
    // A number in the variable keeps its say; anything else is ignored (a warning).
    let from_env = std::env::var("MLX_SERVE_UNFUSED_PREFILL_KEYS").ok().filter(|v| v.trim().parse::<i32>().is_ok());
    let before = unfused_prefill_keys();
    let resident = Cli::try_parse_from(["mlx-serve", "--model", "m"]).unwrap();
    resident.serve.load.options().unwrap();
    assert_eq!(unfused_prefill_keys(), before, "a resident model's load changed it");
    let streamed = Cli::try_parse_from(["mlx-serve", "--model", "m", "--stream-experts"]).unwrap();
    streamed.serve.load.options().unwrap();
    match from_env {
        // The variable keeps its say (kernel development on a GPU machine).
        Some(_) => assert_eq!(unfused_prefill_keys(), before),
        None => {
            assert!(before > 0, "composed ops by default for short histories ({before} keys)");
            assert_eq!(unfused_prefill_keys(), 0);
        }
    }
}

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use mlx_serve::cli::{Cli, Command};
use mlx_serve::generate_cmd;
use mlx_serve::system_info::SystemInfo;

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("mlx-serve: {e}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve(cli.serve)) {
        Command::Serve(args) => match mlx_serve::app::serve(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        Command::Info => match SystemInfo::collect() {
            // Serialising a struct of strings and integers cannot fail.
            Ok(info) => {
                println!("{}", serde_json::to_string_pretty(&info).expect("plain struct"));
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::KvQuality(args) => match mlx_serve::quality::run(&args) {
            // A plain struct of numbers and strings serialises.
            Ok(report) if args.json => {
                println!("{}", serde_json::to_string_pretty(&report).expect("plain struct"));
                ExitCode::SUCCESS
            }
            Ok(report) => {
                println!("{}", mlx_serve::quality::table(&report));
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Generate(args) => match generate_cmd::run(&args) {
            Ok(report) if args.json => {
                println!("{}", serde_json::to_string(&report).expect("plain struct"));
                ExitCode::SUCCESS
            }
            Ok(r) => {
                println!("\n==========");
                println!("Prompt: {} tokens, {:.3} tokens-per-sec", r.prompt_tokens, r.prompt_tps);
                println!(
                    "Generation: {} tokens, {:.3} tokens-per-sec",
                    r.generated_token_ids.len(),
                    r.generation_tps
                );
                println!("Peak memory: {:.3} GB", r.peak_memory_bytes as f64 / 1e9);
                if let Some(e) = &r.experts {
                    println!("Experts: {e}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
    }
}

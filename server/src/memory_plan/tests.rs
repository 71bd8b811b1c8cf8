//! The plan on simulated machines: it never exceeds the budget, flags win,
//! and each choice moves as the memory does.

use super::*;
use crate::kv::KvKind;
use crate::models::weights::WeightFootprint;
use crate::models::{KvLayout, ModelShape};

const GIB: u64 = 1 << 30;

/// A Llama-3.1-8B-like shape: 32 layers of ~218 MiB (bf16), 1 GiB of
/// embedding and head, 8 KV heads of 128 (128 KiB of fp16 KV a token).
fn llama8b() -> ModelShape {
    ModelShape {
        weights: WeightFootprint { layers: vec![218 << 20; 32], routed: vec![0; 32], other: GIB, activation_bits: 16 },
        kv_layout: KvLayout { kinds: vec![KvKind::Dense; 32], kv_heads: 8, head_dim: 128, query_heads: 32, attention_sinks: false, fixed_kv: None },
    }
}

/// A MoE shape: 48 layers of 600 MiB, 560 of them routed experts.
fn moe() -> ModelShape {
    ModelShape {
        weights: WeightFootprint { layers: vec![600 << 20; 48], routed: vec![560 << 20; 48], other: GIB / 2, activation_bits: 16 },
        kv_layout: KvLayout { kinds: vec![KvKind::Dense; 48], kv_heads: 4, head_dim: 128, query_heads: 32, attention_sinks: false, fixed_kv: None },
    }
}

fn cpu(bytes: u64) -> Machine {
    Machine { device_bytes: bytes, device_source: "simulated RAM".into(), host_bytes: None, runtime_bytes: 0, backend: Backend::Cpu, unfused_prefill_keys: 0 }
}

fn cuda(gpu: u64, host: u64) -> Machine {
    Machine { device_bytes: gpu, device_source: "simulated GPU".into(), host_bytes: Some(host), runtime_bytes: GIB, backend: Backend::Cuda, unfused_prefill_keys: 0 }
}

/// A CUDA machine whose prefill chunks over up to 8192 keys attend through
/// composed ops (`MLX_SERVE_UNFUSED_PREFILL_KEYS=8192`).
fn cuda_composed(gpu: u64, host: u64) -> Machine {
    Machine { unfused_prefill_keys: 8192, ..cuda(gpu, host) }
}

fn check_within_budget(p: &MemoryPlan) {
    assert!(p.device_total() <= p.budget_bytes, "planned {} of {}:\n{}", p.device_total(), p.budget_bytes, p.describe());
}

#[test]
fn the_plan_never_exceeds_the_budget_at_any_memory_size() {
    let shapes = [llama8b(), moe()];
    for gib in [20u64, 24, 32, 48, 64, 80, 128, 192] {
        for (shape, streamed) in [(&shapes[0], false), (&shapes[1], true), (&shapes[1], false)] {
            for machine in [cpu(gib * GIB), cuda(gib * GIB, 256 * GIB)] {
                let wants = Wants { stream_experts: streamed, prefill_size: 512, ..Wants::default() };
                match plan(&machine, shape, Some(131_072), &wants) {
                    Ok(p) => {
                        check_within_budget(&p);
                        assert!(p.context <= p.kv_tokens && p.kv_tokens >= 2);
                    }
                    Err(e) => assert!(machine.host_bytes.is_none() && e.to_string().contains("does not fit"), "{gib} GiB: {e}"),
                }
            }
        }
    }
}

#[test]
fn enough_memory_keeps_fp16_every_layer_on_the_gpu_and_the_whole_context() {
    let p = plan(&cuda(80 * GIB, 256 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    assert_eq!((p.gpu_layers, p.kv_format.as_str(), p.context), (None, "fp16", 131_072), "{}", p.describe());
    // The KV pool holds several whole contexts, shared by the running sequences.
    assert!(p.kv_tokens > 3 * 131_072, "{}", p.describe());
}

#[test]
fn less_memory_compresses_the_kv_cache_before_cutting_the_context() {
    // 8.5 GiB of weights; 12 GiB leaves ~2.4 GiB for KV: not one fp16 context (16 GiB).
    let p = plan(&cpu(12 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    assert!(p.kv_format.starts_with("turbo"), "{}", p.describe());
    check_within_budget(&p);
    let roomy = plan(&cpu(24 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    assert_eq!(roomy.kv_format, "kv8", "{}", roomy.describe());
    // CUDA dequantizes the 8-bit cache at every step: TurboQuant instead.
    let on_cuda = plan(&cuda(24 * GIB, 64 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    assert_eq!((on_cuda.kv_format.as_str(), on_cuda.context), ("turbo-balanced", 131_072), "{}", on_cuda.describe());
    check_within_budget(&on_cuda);
    // Too little even for the most compact format: the context is cut to fit.
    let tight = plan(&cpu(10 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    assert_eq!(tight.kv_format, "turbo-compact");
    assert!(tight.context < 131_072 && tight.context == tight.kv_tokens, "{}", tight.describe());
    check_within_budget(&tight);
}

#[test]
fn attention_that_grows_with_the_context_is_planned_beside_the_cache() {
    let metal = |bytes| Machine { backend: Backend::Metal, ..cpu(bytes) };
    let wants = |compression: Option<KvCompression>, context| Wants { kv_compression: compression, context, prefill_size: 512, ..Wants::default() };
    let turbo = || Some(KvCompression::turbo("compact", 4096).unwrap());
    // Unfused (the CPU): a 512-token chunk's scores over the context, 32 query
    // heads of 16 bits, shrink the pool a 16-bit token at a time and count in the plan.
    let scores: f64 = 1.25 * 32.0 * 512.0 * 2.0;
    let fused = plan(&metal(40 * GIB), &llama8b(), Some(131_072), &wants(None, None)).unwrap();
    let unfused = plan(&cpu(40 * GIB), &llama8b(), Some(131_072), &wants(None, None)).unwrap();
    assert_eq!((fused.kv_format.as_str(), unfused.kv_format.as_str(), unfused.context), ("fp16", "fp16", 131_072));
    assert_eq!(fused.attention_working_bytes, 0, "{}", fused.describe());
    assert_eq!(unfused.attention_working_bytes, (scores * 131_072.0).ceil() as u64, "{}", unfused.describe());
    assert!(fused.kv_tokens - unfused.kv_tokens - (scores as u64) < 2, "{} against {}", unfused.kv_tokens, fused.kv_tokens);
    check_within_budget(&unfused);
    // A quantized cache attends by matmuls where the device has them (not
    // CUDA: there attention reads a dequantized history, keys and values at
    // 16 bits); TurboQuant's prefill chunks read a decoded history
    // on every backend.
    let kv8 = || Some(KvCompression::affine(8, 64, 0).unwrap());
    let history: f64 = 2.0 * 2.0 * 8.0 * 128.0 * 2.0;
    let by_matmuls = plan(&metal(20 * GIB), &llama8b(), Some(131_072), &wants(kv8(), None)).unwrap();
    assert_eq!(by_matmuls.attention_working_bytes, (scores * by_matmuls.context as f64).ceil() as u64, "{}", by_matmuls.describe());
    let dequantized = plan(&cuda(12 * GIB, 64 * GIB), &llama8b(), Some(131_072), &wants(kv8(), None)).unwrap();
    assert_eq!(dequantized.attention_working_bytes, (history * dequantized.context as f64).ceil() as u64, "{}", dequantized.describe());
    check_within_budget(&dequantized);
    // Where CUDA's chunks over up to 8192 keys attend through composed ops, their scores too.
    let composed = plan(&cuda_composed(12 * GIB, 64 * GIB), &llama8b(), Some(131_072), &wants(kv8(), None)).unwrap();
    assert_eq!(composed.attention_working_bytes, (history * composed.context as f64 + scores * 8192.0).ceil() as u64, "{}", composed.describe());
    check_within_budget(&composed);
    let compact = plan(&metal(10 * GIB), &llama8b(), Some(131_072), &wants(turbo(), None)).unwrap();
    assert_eq!(compact.attention_working_bytes, (history * compact.context as f64).ceil() as u64, "{}", compact.describe());
    assert!(compact.context < 131_072, "{}", compact.describe());
    check_within_budget(&compact);
    // The CPU reads TurboQuant's history a block at a time: nothing grows
    // with the context. What it holds is the larger of the prompt's first
    // 4096 tokens, held at 16 bits and attended unfused, and two copies of a
    // block (its fewest, 256 positions, of 32 heads x 512 queries of scores
    // and 8 heads x 128 of keys and values, float32).
    let on_cpu = plan(&cpu(10 * GIB), &llama8b(), Some(131_072), &wants(turbo(), None)).unwrap();
    assert_eq!(on_cpu.attention_working_bytes, (scores * 4096.0).ceil() as u64, "{}", on_cpu.describe());
    check_within_budget(&on_cpu);
    let roomier = plan(&cpu(12 * GIB), &llama8b(), Some(131_072), &wants(turbo(), None)).unwrap();
    assert!(roomier.context > on_cpu.context && roomier.attention_working_bytes == on_cpu.attention_working_bytes, "{}", roomier.describe());
    let short_threshold = || Some(KvCompression::turbo("compact", 512).unwrap());
    let blocks = plan(&cpu(10 * GIB), &llama8b(), Some(131_072), &wants(short_threshold(), None)).unwrap();
    assert_eq!(blocks.attention_working_bytes, 2 * 256 * 4 * (32 * 512 + 2 * 8 * 128), "{}", blocks.describe());
    check_within_budget(&blocks);
    // A decode step of 64 sequences holds each row's scores and history: wider still
    // (and their 16-bit recent windows, 24 MiB each, take more of the budget).
    let many = plan(&cpu(12 * GIB), &llama8b(), Some(131_072), &Wants { max_sequences: 64, ..wants(short_threshold(), None) }).unwrap();
    assert_eq!(many.attention_working_bytes, 2 * 256 * 4 * 64 * (32 + 2 * 8 * 128), "{}", many.describe());
    check_within_budget(&many);
    // CUDA fuses 16-bit attention of head dims up to 128 (cuDNN), Metal its own head dims.
    let gpu = cuda(80 * GIB, 256 * GIB);
    assert!(gpu.fuses_prefill_attention(128, 16) && !gpu.fuses_prefill_attention(256, 16) && !gpu.fuses_prefill_attention(128, 32));
    assert!(metal(GIB).fuses_prefill_attention(64, 32) && !metal(GIB).fuses_prefill_attention(256, 16) && !cpu(GIB).fuses_prefill_attention(128, 16));
    assert!(!gpu.prefill_attention(128, 16).quantized_matmuls && metal(GIB).prefill_attention(128, 16).quantized_matmuls && cpu(GIB).prefill_attention(128, 16) == PrefillAttention::CPU);
    // On CUDA the composed chunks' scores span at most the context; fused, there are none.
    let short_cuda = plan(&cuda_composed(80 * GIB, 256 * GIB), &llama8b(), Some(131_072), &wants(None, Some(4096))).unwrap();
    assert_eq!(short_cuda.attention_working_bytes, (scores * 4096.0).ceil() as u64, "{}", short_cuda.describe());
    let fused_cuda = plan(&cuda(80 * GIB, 256 * GIB), &llama8b(), Some(131_072), &wants(None, Some(4096))).unwrap();
    assert_eq!(fused_cuda.attention_working_bytes, 0, "{}", fused_cuda.describe());
    // A shorter context bounds it: the pool gives up only that context's working memory.
    let short = plan(&cpu(40 * GIB), &llama8b(), Some(131_072), &wants(None, Some(8192))).unwrap();
    let free = plan(&metal(40 * GIB), &llama8b(), Some(131_072), &wants(None, Some(8192))).unwrap();
    assert_eq!(short.attention_working_bytes, (scores * 8192.0).ceil() as u64);
    assert!(free.kv_tokens - short.kv_tokens - (scores as u64 / 16) < 2, "{} against {}", short.kv_tokens, free.kv_tokens);
    check_within_budget(&short);
}

#[test]
fn layers_past_gpu_layers_plan_the_cpus_unfused_attention_in_host_memory() {
    // 16-bit attention of head dim 128 is fused on CUDA: nothing grows on the device
    // (where a chunk's scores over the first 8192 keys are attended through composed ops,
    // they are fixed; one-token chunks have none).
    // The CPU's layers attend unfused: their scores come out of host memory.
    let wants = |prefill_size| Wants { gpu_layers: Some(16), context: Some(32_768), prefill_size, ..Wants::default() };
    let (one, chunked) = (plan(&cuda_composed(80 * GIB, 12 * GIB), &llama8b(), None, &wants(1)).unwrap(), plan(&cuda_composed(80 * GIB, 12 * GIB), &llama8b(), None, &wants(512)).unwrap());
    let short_history = |chunk: f64| (1.25 * 32.0 * chunk * 2.0 * 8192.0) as u64;
    assert_eq!((one.attention_working_bytes, chunked.attention_working_bytes), (0, short_history(512.0)));
    assert_eq!((one.attention_working_bytes_per_token, chunked.attention_working_bytes_per_token), (0.0, 0.0));
    // Host memory binds here (half of each token's KV, 64 KiB): a 512-token chunk's scores
    // over the 32K context (1.25 x 32 heads x 2 bytes a position) take their tokens' room.
    let scores = |chunk: f64| 1.25 * 32.0 * chunk * 2.0 * 32_768.0;
    let given_up = ((scores(512.0) - scores(1.0)) / 65_536.0) as u64;
    assert!((one.kv_tokens - chunked.kv_tokens).abs_diff(given_up) <= 1, "{} against {}", chunked.kv_tokens, one.kv_tokens);
}

#[test]
fn a_model_larger_than_the_gpu_keeps_its_later_layers_on_the_cpu() {
    let p = plan(&cuda(6 * GIB, 64 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    let n = p.gpu_layers.expect("layers move to the CPU");
    assert!(n > 0 && n < 32, "{}", p.describe());
    assert_eq!(p.device_weight_bytes + p.host_weight_bytes, llama8b().weights.total());
    check_within_budget(&p);
    // One more layer on the GPU would not leave its working KV.
    let more = GIB + (n as u64 + 1) * (218 << 20) + reserve(6 * GIB, GIB) + (131_072.0 * 4096.0 * (n + 1) as f64 / 32.0) as u64;
    assert!(more > 6 * GIB);
    // Without a GPU of its own nothing moves, and a model too large is refused.
    let e = plan(&cpu(6 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap_err().to_string();
    assert!(e.contains("does not fit") && e.contains("--memory-budget"), "{e}");
}

#[test]
fn streamed_experts_take_half_of_what_the_resident_weights_leave() {
    let p = plan(&cpu(24 * GIB), &moe(), Some(32_768), &Wants { stream_experts: true, ..Wants::default() }).unwrap();
    let cache = p.expert_cache_bytes.unwrap();
    let resident = moe().weights.resident(0..48, true) + moe().weights.other;
    assert_eq!(p.device_weight_bytes, resident);
    let left = 24 * GIB - resident - reserve(24 * GIB, 0);
    assert_eq!(cache, left / 2);
    check_within_budget(&p);
    // Unstreamed, the same model does not fit 24 GiB.
    assert!(plan(&cpu(24 * GIB), &moe(), Some(32_768), &Wants::default()).is_err());
}

#[test]
fn flags_win_over_the_plan() {
    let wants = Wants {
        gpu_layers: Some(10),
        kv_compression: Some(KvCompression::affine(4, 64, 0).unwrap()),
        context: Some(8192),
        prompt_cache_bytes: Some(0),
        budget: Some(CacheBudget::Bytes(40 * GIB)),
        ..Wants::default()
    };
    let p = plan(&cuda(80 * GIB, 256 * GIB), &llama8b(), Some(131_072), &wants).unwrap();
    assert_eq!((p.gpu_layers, p.kv_format.as_str(), p.context, p.prompt_cache_bytes, p.budget_bytes), (Some(10), "kv4", 8192, 0, 40 * GIB));
    assert_eq!(p.from_flags.len(), 5, "{:?}", p.from_flags);
    let all = plan(&cuda(80 * GIB, 256 * GIB), &llama8b(), None, &Wants { gpu_layers: Some(99), ..Wants::default() }).unwrap();
    assert_eq!((all.gpu_layers, all.host_weight_bytes), (None, 0), "more GPU layers than the model has: all of them");
    let e = plan(&cpu(80 * GIB), &llama8b(), None, &Wants { context: Some(0), ..Wants::default() }).unwrap_err().to_string();
    assert!(e.contains("--context-length must be at least 1"), "{e}");
    let share = plan(&cpu(80 * GIB), &llama8b(), None, &Wants { budget: Some(CacheBudget::Share(0.5)), ..Wants::default() }).unwrap();
    assert_eq!(share.budget_bytes, 40 * GIB);
    // --kv-bits with a start: sequences are 16-bit until then, and the pool is sized so.
    let late = Wants { kv_compression: Some(KvCompression::affine(4, 64, 5000).unwrap()), ..Wants::default() };
    let p = plan(&cpu(40 * GIB), &llama8b(), Some(131_072), &late).unwrap();
    assert_eq!((p.kv_format.as_str(), p.kv_bytes_per_token), ("kv4", 131_072.0));
}

/// A Qwen3.5-35B-A3B-like hybrid: 30 linear-attention layers with a state of
/// ~2 MiB per sequence each, 10 full-attention layers with KV.
fn hybrid() -> ModelShape {
    let state = KvKind::Recurrent { state_bytes: 3 * 8192 * 2 + 32 * 128 * 128 * 4 };
    let kinds = (0..40).map(|i| if (i + 1) % 4 == 0 { KvKind::Dense } else { state }).collect();
    ModelShape {
        weights: WeightFootprint { layers: vec![480 << 20; 40], routed: vec![450 << 20; 40], other: GIB / 2, activation_bits: 16 },
        kv_layout: KvLayout { kinds, kv_heads: 2, head_dim: 256, query_heads: 16, attention_sinks: false, fixed_kv: None },
    }
}

#[test]
fn recurrent_states_are_planned_per_running_sequence() {
    let per_sequence = 30 * (3 * 8192 * 2 + 32 * 128 * 128 * 4) as u64;
    for sequences in [1, 8, 64] {
        let wants = Wants { max_sequences: sequences, ..Wants::default() };
        let p = plan(&cpu(32 * GIB), &hybrid(), Some(262_144), &wants).unwrap();
        assert_eq!(p.recurrent_state_bytes, per_sequence * sequences as u64);
        check_within_budget(&p);
        assert!(p.describe().contains("recurrent states"), "{}", p.describe());
        // Only the 10 attention layers' KV counts per token.
        assert_eq!(p.kv_bytes_per_token, 10.0 * 2.0 * 256.0 * 2.0 * 2.0);
    }
    // More sequences, fewer tokens of KV left for them.
    let few = plan(&cpu(32 * GIB), &hybrid(), Some(262_144), &Wants { max_sequences: 1, ..Wants::default() }).unwrap();
    let many = plan(&cpu(32 * GIB), &hybrid(), Some(262_144), &Wants { max_sequences: 64, ..Wants::default() }).unwrap();
    assert!(many.kv_tokens < few.kv_tokens);
    // States that cannot fit are refused, saying why.
    let e = plan(&cpu(24 * GIB), &hybrid(), None, &Wants { max_sequences: 20_000, ..Wants::default() }).unwrap_err().to_string();
    assert!(e.contains("recurrent states of 20000 sequences"), "{e}");
}

/// Two pipeline ranks of one model split unevenly (17 and 15 of its 32
/// layers) on machines of other sizes plan differently; agreed, both run
/// the tightest: the more compressed KV format, the fewer tokens, the
/// shorter context, the smaller prompt cache — and each still fits.
#[test]
fn ranks_that_plan_differently_agree_on_the_tightest_plan() {
    let part = |from: usize, to: usize| {
        let mut s = llama8b();
        s.weights.layers = s.weights.layers[from..to].to_vec();
        s.weights.routed = s.weights.routed[from..to].to_vec();
        s.kv_layout.kinds = s.kv_layout.kinds[from..to].to_vec();
        s
    };
    let a = plan(&cpu(8 * GIB), &part(0, 17), Some(131_072), &Wants::default()).unwrap();
    let b = plan(&cpu(24 * GIB), &part(17, 32), Some(131_072), &Wants::default()).unwrap();
    assert_ne!(a.kv_format, b.kv_format, "the ranks' own plans should differ here:\n{}\n{}", a.describe(), b.describe());
    let terms = tightest(&[a.terms(), b.terms()]).unwrap();
    let (a, b) = (a.adopt(terms).unwrap(), b.adopt(terms).unwrap());
    for field in [|p: &MemoryPlan| p.kv_format.clone(), |p: &MemoryPlan| p.kv_tokens.to_string(), |p: &MemoryPlan| p.context.to_string(), |p: &MemoryPlan| p.prompt_cache_bytes.to_string()] {
        assert_eq!(field(&a), field(&b), "agreed plans differ:\n{}\n{}", a.describe(), b.describe());
    }
    assert_eq!(a.kv_compression, b.kv_compression);
    assert!(a.kv_format.starts_with("turbo"), "the more compressed format wins: {}", a.describe());
    check_within_budget(&a);
    check_within_budget(&b);
    assert_eq!(tightest(&[]), None);
}

#[test]
fn a_float32_models_uncompressed_cache_counts_32_bit_values() {
    // The same shape with float32 activations: its 16-bit-format cache holds
    // 32-bit values, so a token costs twice as much and half as many fit.
    let mut f32_shape = llama8b();
    f32_shape.weights.activation_bits = 32;
    let (half, full) = (plan(&cpu(200 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap(), plan(&cpu(200 * GIB), &f32_shape, Some(131_072), &Wants::default()).unwrap());
    assert_eq!((half.kv_format.as_str(), half.kv_bytes_per_token, half.kv_element_bits), ("fp16", 131_072.0, 16));
    assert_eq!((full.kv_format.as_str(), full.kv_bytes_per_token, full.kv_element_bits), ("fp16", 262_144.0, 32));
    assert!(full.kv_tokens < half.kv_tokens * 6 / 10, "{} against {}", full.kv_tokens, half.kv_tokens);
    check_within_budget(&full);
}

#[test]
fn a_turbo_cache_whose_uncompressed_prompt_leaves_no_room_names_the_threshold() {
    // 8.5 GiB of weights in 10 GiB, minus the reserve: a 32K-token prompt held at
    // 16 bits (4 GiB) before it is compressed leaves nothing; 2K tokens leave room.
    let turbo = |threshold| Wants { kv_compression: Some(KvCompression::turbo("balanced", threshold).unwrap()), ..Wants::default() };
    let e = plan(&cpu(10 * GIB), &llama8b(), Some(131_072), &turbo(32_768)).unwrap_err().to_string();
    assert!(e.contains("32768 tokens held at 16 bits") && e.contains("--turbo-kv-prefill-threshold"), "{e}");
    // On the CPU that prompt attends unfused before it is compressed: its scores are named too.
    assert!(e.contains("GiB of attention's working memory") && e.contains("--prefill-size"), "{e}");
    let p = plan(&cpu(10 * GIB), &llama8b(), Some(131_072), &turbo(2048)).unwrap();
    assert_eq!(p.kv_format, "turbo-balanced", "{}", p.describe());
    check_within_budget(&p);
}

#[test]
fn a_prompts_dequantized_weights_get_a_quarter_of_the_working_buffers() {
    // 80 GiB: a twentieth (4 GiB) for working buffers, beside the CUDA runtime's 1 GiB.
    let p = plan(&cuda(80 * GIB, 256 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    assert_eq!(p.reserve_bytes, 5 * GIB);
    assert_eq!(p.prompt_products_bytes(), (4 * GIB - RUNTIME_BYTES) / 4);
    // Without a runtime of its own (the CPU) the reserve is all working buffers.
    let host = plan(&cpu(64 * GIB), &llama8b(), Some(131_072), &Wants::default()).unwrap();
    assert_eq!(host.prompt_products_bytes(), (64 * GIB / 20 - RUNTIME_BYTES) / 4);
}

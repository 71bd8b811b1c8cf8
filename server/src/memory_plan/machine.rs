//! The memory this machine gives the server: the GPU's (CUDA's free memory,
//! Metal's recommended working set) or, without a GPU, the RAM this process
//! may use — what the kernel reports available, under any cgroup limit.

use std::path::Path;

use mlx_rs_safe::Device;

use crate::error::Result;

/// Memory sizes the plan works from.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Bytes the device that runs the model may use.
    pub device_bytes: u64,
    pub device_source: String,
    /// Host memory beside a GPU's own (CUDA); None where the device's memory
    /// is the host's (Apple silicon, the CPU).
    pub host_bytes: Option<u64>,
    /// Device memory the GPU runtime takes besides MLX's buffers (CUDA's
    /// context, cuBLAS and the kernels: 600-800 MiB measured on an H100).
    pub runtime_bytes: u64,
    /// The MLX backend that runs the model.
    pub backend: Backend,
    /// Keys up to which a prefill chunk attends through composed ops where
    /// the backend fuses attention (CUDA: `kv::unfused_prefill_keys`, 0 by
    /// default), holding their scores.
    pub unfused_prefill_keys: i32,
}

/// An MLX backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

/// See [`Machine::runtime_bytes`].
const CUDA_RUNTIME_BYTES: u64 = 1 << 30;

impl Machine {
    /// Reads this machine's sizes and its MLX backend.
    pub fn detect() -> Result<Machine> {
        let host = host_available();
        let gpu = mlx_rs_safe::kernels::gpu_backend();
        let on_host = Machine::host(host.clone());
        Ok(match gpu {
            Some("cuda") => {
                let cuda = Machine { backend: Backend::Cuda, unfused_prefill_keys: crate::kv::unfused_prefill_keys().max(0), ..on_host };
                match Device::Gpu.info_size(c"free_memory") {
                    Some(free) => Machine {
                        device_bytes: free as u64,
                        device_source: "CUDA free memory".into(),
                        host_bytes: Some(host.0),
                        runtime_bytes: CUDA_RUNTIME_BYTES,
                        ..cuda
                    },
                    None => cuda,
                }
            }
            Some("metal") => {
                let metal = Machine { backend: Backend::Metal, ..on_host };
                match Device::Gpu.info_size(c"max_recommended_working_set_size") {
                    Some(ws) if (ws as u64) < host.0 => Machine { device_bytes: ws as u64, device_source: "Metal's recommended working set".into(), ..metal },
                    _ => metal,
                }
            }
            _ => on_host,
        })
    }

    /// A machine whose model runs in host memory of `(bytes, source)`.
    fn host((bytes, source): (u64, String)) -> Machine {
        Machine { device_bytes: bytes, device_source: source, host_bytes: None, runtime_bytes: 0, backend: Backend::Cpu, unfused_prefill_keys: 0 }
    }

    /// Whether MLX attends a prefill chunk in one fused kernel for heads of
    /// `head_dim` with `element_bits`-bit activations. Where it does not, the
    /// chunk's scores are a [query heads, chunk, context] array: working
    /// memory that grows with the context. MLX 0.32.4 fuses it with cuDNN on
    /// CUDA (16-bit, head dims up to 128, multiples of 8) and with its own
    /// kernel on Metal (head dims 64, 80 and 128); never on the CPU.
    pub fn fuses_prefill_attention(&self, head_dim: i32, element_bits: u32) -> bool {
        match self.backend {
            Backend::Cpu => false,
            Backend::Cuda => element_bits == 16 && head_dim <= 128 && head_dim % 8 == 0,
            Backend::Metal => matches!(head_dim, 64 | 80 | 128),
        }
    }

    /// How this machine's device attends a prefill chunk.
    pub fn prefill_attention(&self, head_dim: i32, element_bits: u32) -> PrefillAttention {
        PrefillAttention {
            fused: self.fuses_prefill_attention(head_dim, element_bits),
            // MLX's CUDA backend has no quantized matmuls for attention
            // (kv::sdpa::quantized_matmuls_run).
            quantized_matmuls: self.backend != Backend::Cuda,
            // kv::turbo::blocked::applies_here: the CPU, unfused.
            blocked_history: self.backend == Backend::Cpu,
            unfused_keys: if self.backend == Backend::Cuda { self.unfused_prefill_keys } else { 0 },
        }
    }
}

/// How a device attends a prefill chunk, as far as its working memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillAttention {
    /// One fused kernel over a 16-bit history: no scores array.
    pub fused: bool,
    /// Quantized matmuls over an affine-quantized history (`--kv-bits`);
    /// where false, the history is dequantized for each attention call.
    pub quantized_matmuls: bool,
    /// TurboQuant's attention reads the compressed history a block at a
    /// time (bounded working memory) rather than decoded whole.
    pub blocked_history: bool,
    /// Where `fused`, a chunk over a history of up to this many keys still
    /// attends through composed ops ([`Machine::unfused_prefill_keys`]),
    /// holding their scores.
    pub unfused_keys: i32,
}

impl PrefillAttention {
    /// The CPU's (layers past --gpu-layers).
    pub const CPU: PrefillAttention = PrefillAttention { fused: false, quantized_matmuls: true, blocked_history: true, unfused_keys: 0 };
}

/// Host memory this process may still take, and where the figure came from.
fn host_available() -> (u64, String) {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| meminfo_available(&t));
    let (mut bytes, mut source) = match meminfo {
        Some(b) => (b, "available RAM (/proc/meminfo)".to_string()),
        None => (physical_memory(), "physical RAM".to_string()),
    };
    if let Some(room) = cgroup_room(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup")) {
        if room < bytes {
            bytes = room;
            source = "the cgroup's memory limit".to_string();
        }
    }
    (bytes, source)
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Installed memory where /proc/meminfo is absent (macOS: `sysctl hw.memsize`);
/// 0 when unknown, which makes the plan ask for --memory-budget.
fn physical_memory() -> u64 {
    std::process::Command::new("sysctl")
        .args(["-n", "hw.memsize"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// Memory the cgroup of this process may still take (limit − usage), for
/// cgroup v2 (`memory.max`, `memory.current`) and v1 (`memory.limit_in_bytes`,
/// `memory.usage_in_bytes`); None without a limit.
fn cgroup_room(self_cgroup: &Path, root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(self_cgroup).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let (dir, limit_file, usage_file) = if controllers.is_empty() {
            (root.join(path), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory").join(path), "memory.limit_in_bytes", "memory.usage_in_bytes")
        } else {
            continue;
        };
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|t| t.trim().parse::<u64>().ok());
        // "max" (v2) does not parse; v1 writes a huge number for "no limit".
        if let Some(limit) = read(limit_file).filter(|&l| l < (1 << 60)) {
            return Some(limit.saturating_sub(read(usage_file).unwrap_or(0)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_available(text), Some(20_000_000 * 1024));
        assert_eq!(meminfo_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn a_cgroup_limit_bounds_the_memory_both_in_v1_and_v2() {
        let root = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let p = root.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("self_v1", "4:memory:/box\n1:cpu:/\n");
        write("memory/box/memory.limit_in_bytes", "1073741824\n");
        write("memory/box/memory.usage_in_bytes", "73741824\n");
        assert_eq!(cgroup_room(&root.path().join("self_v1"), root.path()), Some(1_000_000_000));
        write("self_v2", "0::/box2\n");
        write("box2/memory.max", "2000\n");
        write("box2/memory.current", "500\n");
        assert_eq!(cgroup_room(&root.path().join("self_v2"), root.path()), Some(1500));
        write("box3/memory.max", "max\n");
        write("self_v2_unlimited", "0::/box3\n");
        assert_eq!(cgroup_room(&root.path().join("self_v2_unlimited"), root.path()), None);
        write("memory/huge/memory.limit_in_bytes", "9223372036854771712\n");
        write("self_v1_unlimited", "4:memory:/huge\n");
        assert_eq!(cgroup_room(&root.path().join("self_v1_unlimited"), root.path()), None);
    }
}

//! Which device runs each decoder layer (`--gpu-layers`): the first layers on
//! MLX's default device, the rest, and the output head after them, on the CPU.
//!
//! Nothing moves weights by hand: a layer's ops run on the CPU stream, so the
//! buffers only they touch stay in host memory (MLX's CUDA buffers are managed
//! memory, placed where they are used; Apple's memory is shared), and MLX
//! orders the work across the two streams.

use mlx_rs_safe::{with_stream, Device, Stream};

use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Layers run on the default device; later ones run on the CPU.
    gpu_layers: usize,
}

impl Default for Placement {
    /// Every layer on the default device.
    fn default() -> Self {
        Placement { gpu_layers: usize::MAX }
    }
}

impl Placement {
    pub fn gpu_layers(gpu_layers: usize) -> Placement {
        Placement { gpu_layers }
    }

    /// Runs `f`, the work of layer `layer`, on that layer's device.
    pub fn run<R>(&self, layer: usize, f: impl FnOnce() -> Result<R>) -> Result<R> {
        if layer < self.gpu_layers {
            return f();
        }
        with_stream(&Stream::default_for(Device::Cpu)?, f)
    }

    /// Runs `f`, the final norm and output head of a model of `layers`
    /// layers, where its last layer runs (with the data it hands over).
    pub fn run_head<R>(&self, layers: usize, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.run(layers.saturating_sub(1), f)
    }
}

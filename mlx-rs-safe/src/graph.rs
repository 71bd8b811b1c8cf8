//! What a lazy graph holds, without evaluating it: its operations by MLX
//! primitive, and the arrays it reads that no operation makes (weights,
//! caches, data). MLX's host cost of a decode step grows with the
//! operations it walks and encodes, so their count is a host-speed figure
//! that no lent machine's drift moves.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::{check, init, Error, Result};
use crate::transforms::VectorArray;

/// The operations of a graph by primitive name, most first (ties by name),
/// and the number of arrays it reads that no operation of it makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphOps {
    pub by_primitive: Vec<(String, usize)>,
    pub inputs: usize,
}

impl GraphOps {
    /// All the graph's operations (an op with several outputs counts once).
    pub fn total(&self) -> usize {
        self.by_primitive.iter().map(|(_, n)| n).sum()
    }
}

/// The graph that evaluating `outputs` would run (MLX's `print_graph`,
/// counted).
pub fn graph_ops(outputs: &[&Array]) -> Result<GraphOps> {
    Ok(count(&print_graph(outputs)?))
}

/// MLX's `print_graph` text of the graph behind `outputs`.
fn print_graph(outputs: &[&Array]) -> Result<String> {
    init();
    let v = VectorArray::new(outputs);
    // SAFETY: no arguments; a new namer, freed below.
    let namer = unsafe { sys::mlx_node_namer_new() };
    // SAFETY: no arguments; an anonymous temporary file, closed below.
    let file = unsafe { libc::tmpfile() };
    if file.is_null() {
        // SAFETY: the namer is live and freed once.
        unsafe { sys::mlx_node_namer_free(namer) };
        return Err(Error::Mlx(format!("no temporary file for the graph: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: a live FILE (bindgen's FILE is libc's type under another name),
    // namer and vector.
    let printed = check(unsafe { sys::mlx_print_graph(file as *mut sys::FILE, namer, v.raw) });
    let mut text = Vec::new();
    if printed.is_ok() {
        // SAFETY: the live FILE, rewound and read into a local buffer of the
        // stated size until its end.
        unsafe {
            libc::fflush(file);
            libc::rewind(file);
            let mut buf = [0u8; 65536];
            loop {
                let n = libc::fread(buf.as_mut_ptr().cast(), 1, buf.len(), file);
                if n == 0 {
                    break;
                }
                text.extend_from_slice(&buf[..n]);
            }
        }
    }
    // SAFETY: each is live and released once.
    unsafe {
        libc::fclose(file);
        sys::mlx_node_namer_free(namer);
    }
    printed?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Counts `print_graph`'s text: an `Inputs:` line of `NAME [shape, dtype]`
/// items, an `Outputs:` line, then a line per operation, its primitive's
/// name first.
fn count(text: &str) -> GraphOps {
    let mut inputs = 0;
    let mut ops: std::collections::BTreeMap<&str, usize> = Default::default();
    for line in text.lines() {
        if let Some(list) = line.strip_prefix("Inputs:") {
            // Each item ends its shape and dtype with the only `]` it holds.
            inputs = list.matches(']').count();
        } else if line.starts_with("Outputs:") || line.trim().is_empty() {
            continue;
        } else if let Some(name) = line.split_whitespace().next() {
            *ops.entry(name).or_default() += 1;
        }
    }
    let mut by_primitive: Vec<(String, usize)> = ops.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    by_primitive.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    GraphOps { by_primitive, inputs }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;

    #[test]
    fn a_graph_counts_its_ops_and_inputs() {
        let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let b = Array::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2]).unwrap();
        let sum = ops::add(&a, &b).unwrap();
        let out = ops::multiply(&ops::add(&sum, &a).unwrap(), &ops::transpose_axes(&sum, &[1, 0]).unwrap()).unwrap();
        let g = graph_ops(&[&out]).unwrap();
        assert_eq!(g.by_primitive, vec![("Add".to_string(), 2), ("Multiply".to_string(), 1), ("Transpose".to_string(), 1)]);
        assert_eq!((g.total(), g.inputs), (4, 2));
        // Nothing was evaluated: the graph is still there to count.
        assert_eq!(graph_ops(&[&out]).unwrap(), g);
        crate::eval(&[&out]).unwrap();
        let done = graph_ops(&[&out]).unwrap();
        assert_eq!((done.total(), done.inputs), (0, 1), "an evaluated array is an input of nothing");
    }

    #[test]
    fn the_text_is_counted_as_mlx_prints_it() {
        let text = "Inputs: A [(2,2), float32], B [(1), int32]\nOutputs: D [(2,2), float32]\nAdd A [(2,2), float32], A [(2,2), float32] -> C [(2,2), float32]\nSplit C [(2,2), float32] -> D [(1,2), float32], E [(1,2), float32]\nAdd D [(1,2), float32], B [(1), int32] -> F [(1,2), float32]\n";
        let g = count(text);
        assert_eq!(g.by_primitive, vec![("Add".to_string(), 2), ("Split".to_string(), 1)]);
        assert_eq!(g.inputs, 2);
    }
}

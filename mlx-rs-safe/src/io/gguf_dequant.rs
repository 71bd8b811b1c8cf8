//! ggml's block formats decoded to float values.
//!
//! One function per block type, each a plain loop over one block following
//! the layout in ggml's `ggml-common.h` (the `block_*` structs) and
//! `dequantize_row_*` in `ggml-quants.c`. Values are computed in f32 with the
//! same operations in the same order as ggml (and gguf-py, which mirrors it),
//! e.g. `(d * scale) * q - dmin * min`, without fused multiply-adds, so they
//! are the same bits; they are then rounded to the output type.
//!
//! K-quants pack 256 values into a super-block with one f16 scale `d` (and for
//! Q2_K/Q4_K/Q5_K an f16 `dmin`) and small integer scales per sub-block of 16
//! or 32 values.

use half::{bf16, f16};

use super::gguf_type::GgufType;

/// An output element type: f32 values are written as it.
pub(crate) trait FromF32: Copy + Send {
    fn from_f32(x: f32) -> Self;
}

impl FromF32 for f32 {
    fn from_f32(x: f32) -> f32 {
        x
    }
}

/// Rounded to nearest, ties to even.
impl FromF32 for f16 {
    fn from_f32(x: f32) -> f16 {
        f16::from_f32(x)
    }
}

/// Rounded to nearest, ties to even.
impl FromF32 for bf16 {
    fn from_f32(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
}

/// Decodes whole blocks: `raw` holds blocks of the type, `y` receives their values.
type Decode = fn(raw: &[u8], y: &mut [f32]);

fn decoder(ty: GgufType) -> Option<Decode> {
    Some(match ty {
        GgufType::F32 => f32s,
        GgufType::F16 => f16s,
        GgufType::Bf16 => bf16s,
        GgufType::Q4_0 => q4_0,
        GgufType::Q4_1 => q4_1,
        GgufType::Q5_0 => q5_0,
        GgufType::Q5_1 => q5_1,
        GgufType::Q8_0 => q8_0,
        GgufType::Q2K => q2_k,
        GgufType::Q3K => q3_k,
        GgufType::Q4K => q4_k,
        GgufType::Q5K => q5_k,
        GgufType::Q6K => q6_k,
        GgufType::Other(_) => return None,
    })
}

/// Values decoded at a time into a stack buffer before conversion; a
/// multiple of every block size.
const CHUNK: usize = 4096;
/// Below this many values per thread, splitting costs more than it saves.
const MIN_PER_THREAD: usize = 1 << 18;

/// How many threads `units` of work take: one per core, each with at least
/// `min_per_thread` units (one thread for small tensors).
pub(crate) fn threads_for(units: usize, min_per_thread: usize) -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(units / min_per_thread).max(1)
}

/// Decodes `raw` (whole blocks of `ty`) into `out`, one value per element,
/// splitting large tensors across threads. Errs (with a message) for a type
/// that is not readable or sizes that do not match.
pub(crate) fn dequantize<T: FromF32>(ty: GgufType, raw: &[u8], out: &mut [T]) -> Result<(), String> {
    let decode = decoder(ty).ok_or_else(|| format!("{} is not supported", ty.name()))?;
    let (per, bytes) = ty.block().map(|(p, b)| (p as usize, b as usize)).ok_or_else(|| format!("{} has no block size", ty.name()))?;
    if !out.len().is_multiple_of(per) || raw.len() != out.len() / per * bytes {
        return Err(format!("{} bytes of {} do not hold {} values", raw.len(), ty.name(), out.len()));
    }
    let threads = threads_for(out.len(), MIN_PER_THREAD);
    if threads == 1 {
        decode_serial(decode, per, bytes, raw, out);
        return Ok(());
    }
    // Whole chunks per thread, so that every part starts on a block boundary.
    let part = out.len().div_ceil(threads).div_ceil(CHUNK) * CHUNK;
    std::thread::scope(|s| {
        for (raw, out) in raw.chunks(part / per * bytes).zip(out.chunks_mut(part)) {
            s.spawn(move || decode_serial(decode, per, bytes, raw, out));
        }
    });
    Ok(())
}

fn decode_serial<T: FromF32>(decode: Decode, per: usize, bytes: usize, raw: &[u8], out: &mut [T]) {
    let mut buf = [0f32; CHUNK];
    for (raw, out) in raw.chunks(CHUNK / per * bytes).zip(out.chunks_mut(CHUNK)) {
        let y = &mut buf[..out.len()];
        decode(raw, y);
        for (o, &v) in out.iter_mut().zip(y.iter()) {
            *o = T::from_f32(v);
        }
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn f32s(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(4).zip(y) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

fn f16s(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(2).zip(y) {
        *y = f16_at(b, 0);
    }
}

fn bf16s(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(2).zip(y) {
        *y = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// Q4_0, 18 bytes: d (f16), qs[16]. Value j is the low nibble of qs[j],
/// value j + 16 the high one; x = d * (q - 8).
fn q4_0(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(18).zip(y.chunks_exact_mut(32)) {
        let (d, qs) = (f16_at(b, 0), &b[2..18]);
        for j in 0..16 {
            y[j] = d * ((qs[j] & 15) as i32 - 8) as f32;
            y[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
        }
    }
}

/// Q4_1, 20 bytes: d, m (f16), qs[16] as in Q4_0; x = d * q + m.
fn q4_1(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(20).zip(y.chunks_exact_mut(32)) {
        let (d, m, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..20]);
        for j in 0..16 {
            y[j] = d * (qs[j] & 15) as f32 + m;
            y[j + 16] = d * (qs[j] >> 4) as f32 + m;
        }
    }
}

/// The 5-bit codes of a Q5_0/Q5_1 block: nibbles as in Q4_0, the fifth bit
/// of value j is bit j of the little-endian u32 `qh`.
fn five_bit_codes(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 15) | (((qh >> j) & 1) as u8) << 4;
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
    }
    q
}

/// Q5_0, 22 bytes: d (f16), qh[4], qs[16]; x = d * (q - 16).
fn q5_0(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(22).zip(y.chunks_exact_mut(32)) {
        let (d, q) = (f16_at(b, 0), five_bit_codes(&b[2..6], &b[6..22]));
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = d * (q as i32 - 16) as f32;
        }
    }
}

/// Q5_1, 24 bytes: d, m (f16), qh[4], qs[16]; x = d * q + m.
fn q5_1(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(24).zip(y.chunks_exact_mut(32)) {
        let (d, m, q) = (f16_at(b, 0), f16_at(b, 2), five_bit_codes(&b[4..8], &b[8..24]));
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = d * q as f32 + m;
        }
    }
}

/// Q8_0, 34 bytes: d (f16), qs[32] (int8); x = q * d.
fn q8_0(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(34).zip(y.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..34]) {
            *y = q as i8 as f32 * d;
        }
    }
}

/// Q2_K, 84 bytes: scales[16], qs[64], d, dmin (f16). Each half of 128
/// values takes 32 bytes of qs: value 32 * s + l of the half is bits
/// 2s..2s+2 of byte l. Sub-block i (16 values) has scale byte scales[i]:
/// low nibble times d is its scale, high nibble times dmin its minimum;
/// x = (d * sc) * q - dmin * m.
fn q2_k(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(84).zip(y.chunks_exact_mut(256)) {
        let (scales, qs, d, dmin) = (&b[0..16], &b[16..80], f16_at(b, 80), f16_at(b, 82));
        for half in 0..2 {
            for s in 0..4 {
                for l in 0..32 {
                    let i = half * 128 + s * 32 + l;
                    let sc = scales[i / 16];
                    let (dl, ml) = (d * (sc & 15) as f32, dmin * (sc >> 4) as f32);
                    let q = (qs[half * 32 + l] >> (2 * s)) & 3;
                    y[i] = dl * q as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K, 110 bytes: hmask[32], qs[64], scales[12], d (f16). The low two
/// bits of each value are laid out as in Q2_K; the third bit of value i is
/// bit i / 32 of hmask[i % 32], and a clear bit subtracts 4 (q in -4..=3).
/// The 16 sub-block scales are 6-bit, stored minus 32: scale k has its low
/// nibble in scales[k % 8] (low nibble for k < 8, high for k >= 8) and its
/// top two bits at bits 2 * (k / 4) of scales[8 + k % 4]; x = (d * sc) * q.
fn q3_k(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(110).zip(y.chunks_exact_mut(256)) {
        let (hmask, qs, packed, d) = (&b[0..32], &b[32..96], &b[96..108], f16_at(b, 108));
        let scale: [i32; 16] = std::array::from_fn(|k| {
            let low = (packed[k % 8] >> (4 * (k / 8))) & 15;
            let high = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
            (low | high << 4) as i32 - 32
        });
        for half in 0..2 {
            for s in 0..4 {
                for l in 0..32 {
                    let i = half * 128 + s * 32 + l;
                    let low = ((qs[half * 32 + l] >> (2 * s)) & 3) as i32;
                    let q = if (hmask[l] >> (i / 32)) & 1 == 1 { low } else { low - 4 };
                    y[i] = d * scale[i / 16] as f32 * q as f32;
                }
            }
        }
    }
}

/// The 6-bit scale and minimum of sub-block j (0..8) of a Q4_K/Q5_K block
/// from its 12 packed bytes: for j < 4 the low 6 bits of bytes j and j + 4;
/// for j >= 4 the nibbles of byte j + 4 with the top two bits of bytes
/// j - 4 and j as their high bits.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | (s[j - 4] >> 6) << 4, (s[j + 4] >> 4) | (s[j] >> 6) << 4)
    }
}

/// Q4_K, 144 bytes: d, dmin (f16), scales[12], qs[128]. Eight sub-blocks of
/// 32: sub-block 2c takes the low nibbles of qs[32c..32c+32], sub-block
/// 2c + 1 the high ones; x = (d * sc) * q - dmin * m.
fn q4_k(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(144).zip(y.chunks_exact_mut(256)) {
        let (d, dmin, scales, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..144]);
        for sub in 0..8 {
            let (sc, m) = scale_min_k4(sub, scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            for l in 0..32 {
                let q = (qs[sub / 2 * 32 + l] >> (4 * (sub % 2))) & 15;
                y[sub * 32 + l] = d1 * q as f32 - m1;
            }
        }
    }
}

/// Q5_K, 176 bytes: d, dmin (f16), scales[12], qh[32], qs[128]. As Q4_K,
/// with a fifth bit for value l of sub-block j at bit j of qh[l].
fn q5_k(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(176).zip(y.chunks_exact_mut(256)) {
        let (d, dmin, scales, qh, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..48], &b[48..176]);
        for sub in 0..8 {
            let (sc, m) = scale_min_k4(sub, scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            for l in 0..32 {
                let q = ((qs[sub / 2 * 32 + l] >> (4 * (sub % 2))) & 15) | ((qh[l] >> sub) & 1) << 4;
                y[sub * 32 + l] = d1 * q as f32 - m1;
            }
        }
    }
}

/// Q6_K, 210 bytes: ql[128], qh[64], scales[16] (int8), d (f16). Each half
/// of 128 values takes 64 bytes of ql and 32 of qh: value 32 * s + l of the
/// half has its low nibble from ql[l] (s = 0), ql[l + 32] (s = 1) or the
/// high nibbles of those (s = 2, 3), and its top two bits at bits 2s..2s+2
/// of qh[l]; q = code - 32, x = (d * scales[i / 16]) * q.
fn q6_k(raw: &[u8], y: &mut [f32]) {
    for (b, y) in raw.chunks_exact(210).zip(y.chunks_exact_mut(256)) {
        let (ql, qh, scales, d) = (&b[0..128], &b[128..192], &b[192..208], f16_at(b, 208));
        for half in 0..2 {
            let (ql, qh) = (&ql[half * 64..half * 64 + 64], &qh[half * 32..half * 32 + 32]);
            for s in 0..4 {
                for l in 0..32 {
                    let i = half * 128 + s * 32 + l;
                    let low = (ql[l + 32 * (s % 2)] >> (4 * (s / 2))) & 15;
                    let q = (low | ((qh[l] >> (2 * s)) & 3) << 4) as i32 - 32;
                    y[i] = d * scales[i / 16] as i8 as f32 * q as f32;
                }
            }
        }
    }
}

//! The newest positions of a TurboQuant cache, kept unquantized beside their
//! codes (KIVI's and the QJL paper's recent window; the TurboQuant brief's
//! "first 4 + last 128"). Attention concentrates on recent tokens, so their
//! quantization error costs the most: on SmolLM2-135M, keeping the last 128
//! exact cut `balanced`'s KL divergence from the 16-bit cache 19x, below
//! `--kv-bits 8`'s (BENCHMARKS.md), for 128 positions of 16-bit memory per
//! row and layer (in room for 192).
//!
//! Every position is still encoded into the body: the window is a copy, so
//! a rewind, a prompt-cache prefix or a batch merge never lacks a position's
//! codes; where the window lacks a position it is read from them.
//!
//! The window holds the body's last columns for every row (rows are
//! left-padded to one write position, so those are each row's newest
//! tokens; columns of a row's padding or sinks are never read), in the
//! model's dtype, rotated like the codes: attention reads the window with
//! the query it rotated for them, and the window's value sum joins the
//! body's in the rotated basis (on a GPU the encode kernel hands back the
//! new position's rotated key and value, and the attention kernel reads the
//! window as its last split).

use mlx_rs_safe::{ops, Array, Dtype};

use crate::error::Result;

/// Positions of each row kept unquantized.
pub const RECENT: i32 = 128;

#[cfg(test)]
thread_local! {
    /// A window for this thread's tests, so short rows cross it.
    pub static TEST_RECENT: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// Positions each row keeps unquantized: [`RECENT`].
pub fn window() -> i32 {
    #[cfg(test)]
    if let Some(w) = TEST_RECENT.with(|w| w.get()) {
        return w;
    }
    RECENT
}

/// Positions a row's window buffers hold for a window of `w`: the window is
/// copied down to its newest `w` positions once it fills them, not at every step.
const fn room_for(w: i32) -> i32 {
    w + w / 2
}

/// The buffers' positions for [`RECENT`] (what the memory plan counts).
pub const ROOM: i32 = room_for(RECENT);

/// The buffers' positions for [`window`].
fn room() -> i32 {
    room_for(window())
}

/// The newest [`window`] positions of `keys` and `values` ([B, H, n, D])
/// as one [B, H, 2, m, D] array: the window's layout, keys then values (so a
/// decode step's new position goes in with one update), the form
/// [`Recent::new`] and [`Recent::push`] take.
pub fn pair(keys: &Array, values: &Array) -> Result<Array> {
    let n = keys.dim(2)?;
    let newest = |x: &Array| ops::slice_axis(x, 2, (n - window()).max(0), n);
    Ok(ops::stack(&[&newest(keys)?, &newest(values)?], 2)?)
}

#[derive(Clone)]
pub struct Recent {
    /// [B, kv_heads, 2, room(), D]: keys at index 0 of the third axis,
    /// values at 1; the first `filled` slots are the body's last `filled`
    /// columns, oldest first. Attention reads the newest [`window`] of them
    /// (see [`Recent::held`]).
    pairs: Array,
    filled: i32,
}

/// The slots axis of the window's buffer.
const SLOTS: i32 = 3;

impl Recent {
    /// The newest (at most [`window`]) of `pairs` ([B, H, 2, n, D], from
    /// [`pair`]: the body's newest n columns, rotated), kept as `dtype` (the
    /// model's).
    pub fn new(pairs: &Array, dtype: Dtype) -> Result<Recent> {
        let s = pairs.shape();
        let room = ops::zeros(&[s[0], s[1], 2, room(), s[4]], dtype)?;
        let mut recent = Recent { pairs: room, filled: 0 };
        recent.push(pairs)?;
        Ok(recent)
    }

    /// Positions attention reads from the window: the body's last `held`
    /// columns (each row's newest tokens, up to [`window`]).
    pub fn held(&self) -> i32 {
        self.filled.min(window())
    }

    /// The buffer's slot of the oldest position attention reads.
    pub fn start(&self) -> i32 {
        self.filled - self.held()
    }

    /// The buffer's slots in use: attention reads `start()..filled()`.
    pub fn filled(&self) -> i32 {
        self.filled
    }

    /// Appends the body's next columns (`pairs` [B, H, 2, n, D], from
    /// [`pair`] or the encode kernel; rotated), keeping the newest
    /// [`window`] once the room is used up.
    pub fn push(&mut self, pairs: &Array) -> Result<()> {
        let n = pairs.dim(SLOTS)?;
        let room = self.pairs.dim(SLOTS)?;
        let dtype = self.pairs.dtype();
        let new = if pairs.dtype() == dtype { pairs.clone() } else { ops::astype(pairs, dtype)? };
        if self.filled + n <= room {
            let s = self.pairs.shape();
            let (start, stop) = ([0, 0, 0, self.filled, 0], [s[0], s[1], 2, self.filled + n, s[4]]);
            self.pairs = ops::slice_update(&self.pairs, &new, &start, &stop, &[1, 1, 1, 1, 1])?;
            self.filled += n;
            return Ok(());
        }
        // Full: the newest `window` of what is held and the new positions.
        let w = window();
        let keep = (w - n).clamp(0, self.filled);
        let old = ops::slice_axis(&self.pairs, SLOTS, self.filled - keep, self.filled)?;
        let joined = ops::concatenate(&[&old, &new], SLOTS)?;
        let len = joined.dim(SLOTS)?;
        let last = ops::slice_axis(&joined, SLOTS, (len - w).max(0), len)?;
        let mut pad_shape = last.shape();
        pad_shape[SLOTS as usize] = room - last.dim(SLOTS)?;
        self.pairs = ops::concatenate(&[&last, &ops::zeros(&pad_shape, dtype)?], SLOTS)?;
        self.filled = (keep + n).min(w);
        Ok(())
    }

    /// Where a decode step's one new position goes (the step encode kernel's
    /// `moves`, `kernels::encode_step`): slots `src..src + keep` move to
    /// `0..keep` and the position takes slot `keep` — `(0, filled)` while the
    /// room lasts, else the newest `window - 1` positions move down, as
    /// [`Recent::push`] does for one position.
    pub fn step_moves(&self) -> Result<(i32, i32)> {
        if self.filled < self.pairs.dim(SLOTS)? {
            return Ok((0, self.filled));
        }
        let keep = (window() - 1).clamp(0, self.filled);
        Ok((self.filled - keep, keep))
    }

    /// The window after a decode step: `buffer`, written by the step encode
    /// kernel for `step_moves`' `(src, keep)`.
    pub fn stepped(&mut self, buffer: Array, (_, keep): (i32, i32)) {
        self.pairs = buffer;
        self.filled = keep + 1;
    }

    /// Forgets the newest `n` positions (the body dropped them too).
    pub fn trim(&mut self, n: i32) {
        self.filled -= n.clamp(0, self.filled);
    }

    /// Rows `rows` and slots `from..to` of the keys (`which` 0) or values
    /// (1), [rows, H, to - from, D].
    fn part(&self, rows: (i32, i32), which: i32, from: i32, to: i32) -> Result<Array> {
        let s = self.pairs.shape();
        let slots = ops::slice(&self.pairs, &[rows.0, 0, which, from, 0], &[rows.1, s[1], which + 1, to, s[4]], &[1, 1, 1, 1, 1])?;
        Ok(ops::squeeze(&slots, &[2])?)
    }

    /// The keys and values attention reads, [B, H, held, D].
    pub fn views(&self) -> Result<[Array; 2]> {
        let rows = (0, self.pairs.dim(0)?);
        Ok([self.part(rows, 0, self.start(), self.filled)?, self.part(rows, 1, self.start(), self.filled)?])
    }

    /// The whole buffer (the GPU kernels read slots `start()..filled()` of it).
    pub fn buffer(&self) -> &Array {
        &self.pairs
    }

    /// Row `b`'s held positions that are its tokens (`tokens`: how many it
    /// holds past its sinks), keys and values [1, H, m, D].
    pub fn row(&self, b: usize, tokens: i32) -> Result<[Array; 2]> {
        let m = self.held().min(tokens.max(0));
        let (b, from) = (b as i32, self.filled - m);
        Ok([self.part((b, b + 1), 0, from, self.filled)?, self.part((b, b + 1), 1, from, self.filled)?])
    }

    /// A batch's window from its rows' windows (`rows`: each row's exact
    /// newest keys and values, [1, H, m_b, D]) over `decoded`: the batch
    /// body's last columns decoded from their codes ([B, H, held, D], the
    /// model's dtype, rotated), which stand in where a row's window is shorter.
    pub fn from_rows(rows: &[[Array; 2]], decoded: [Array; 2]) -> Result<Recent> {
        let [mut keys, mut values] = decoded;
        let held = keys.dim(2)?;
        for (b, [rk, rv]) in rows.iter().enumerate() {
            let m = rk.dim(2)?.min(held);
            if m == 0 {
                continue;
            }
            let (rk, rv) = (ops::slice_axis(rk, 2, rk.dim(2)? - m, rk.dim(2)?)?, ops::slice_axis(rv, 2, rv.dim(2)? - m, rv.dim(2)?)?);
            let s = keys.shape();
            let b = b as i32;
            let (start, stop) = ([b, 0, held - m, 0], [b + 1, s[1], held, s[3]]);
            keys = ops::slice_update(&keys, &ops::astype(&rk, keys.dtype())?, &start, &stop, &[1, 1, 1, 1])?;
            values = ops::slice_update(&values, &ops::astype(&rv, keys.dtype())?, &start, &stop, &[1, 1, 1, 1])?;
        }
        let dtype = keys.dtype();
        Recent::new(&pair(&keys, &values)?, dtype)
    }

    pub fn nbytes(&self) -> usize {
        self.pairs.nbytes()
    }

    pub fn arrays(&self) -> Vec<Array> {
        vec![self.pairs.clone()]
    }
}

/// How many of a row's `n` stored window positions remain in its prefix of
/// `prefix` tokens when it held `offset`: the window's positions are the
/// row's last ones, so a prefix keeps those before its end.
pub fn prefix_len(n: i32, offset: i32, prefix: i32) -> i32 {
    (n - (offset - prefix)).clamp(0, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::values;
    use mlx_rs_safe::Dtype;

    /// Positions from..to of one row, one head, head dim 1: their own numbers.
    fn positions(from: i32, to: i32) -> Array {
        let v: Vec<f32> = (from..to).map(|p| p as f32).collect();
        Array::from_slice(&v, &[1, 1, to - from, 1]).unwrap()
    }

    /// Positions from..to as keys and their negatives as values, in the window's layout.
    fn both(from: i32, to: i32) -> Array {
        let k = positions(from, to);
        pair(&k, &ops::negative(&k).unwrap()).unwrap()
    }

    /// The keys attention reads (checking the values are their negatives).
    fn read(r: &Recent) -> Vec<f32> {
        let [k, v] = r.views().unwrap();
        let keys = values(&k);
        assert_eq!(values(&v), keys.iter().map(|x| -x).collect::<Vec<_>>());
        keys
    }

    #[test]
    fn the_window_keeps_the_newest_positions_as_it_fills_and_shifts() {
        TEST_RECENT.with(|w| w.set(Some(4)));
        let mut r = Recent::new(&both(0, 10), Dtype::Float32).unwrap();
        assert_eq!((r.held(), read(&r)), (4, vec![6.0, 7.0, 8.0, 9.0]));
        // Its room (6) fills a position at a time, then it copies its newest down.
        for p in 10..13 {
            r.push(&both(p, p + 1)).unwrap();
            assert_eq!(read(&r), ((p - 3)..=p).map(|x| x as f32).collect::<Vec<_>>());
        }
        assert_eq!(r.filled(), 4, "copied down once its room was used up");
        // A chunk longer than the window leaves its own newest.
        r.push(&both(13, 20)).unwrap();
        assert_eq!(read(&r), vec![16.0, 17.0, 18.0, 19.0]);
        // A rewind reads fewer until new positions come.
        r.trim(2);
        assert_eq!(read(&r), vec![16.0, 17.0]);
        r.push(&both(18, 19)).unwrap();
        assert_eq!(read(&r), vec![16.0, 17.0, 18.0]);
        // A row's part: only its own tokens.
        assert_eq!(values(&r.row(0, 2).unwrap()[0]), vec![17.0, 18.0]);
        TEST_RECENT.with(|w| w.set(None));
    }

    /// What the step encode kernel writes for `moves` (turbo_encode.cu with
    /// TURBO_ENCODE_STEP): slots below `keep` from `src` on, `new` at `keep`,
    /// zeros after.
    fn kernel_step(old: &Array, new: &Array, (src, keep): (i32, i32)) -> Array {
        let room = old.dim(SLOTS).unwrap();
        let kept = ops::slice_axis(old, SLOTS, src, src + keep).unwrap();
        let mut rest = old.shape();
        rest[SLOTS as usize] = room - keep - 1;
        ops::concatenate(&[&kept, new, &ops::zeros(&rest, old.dtype()).unwrap()], SLOTS).unwrap()
    }

    #[test]
    fn a_decode_steps_window_moves_are_those_of_a_push() {
        // Stepped as the GPU does (the kernel's moves), the window reads what a
        // push of each position leaves: while the room lasts, when it is used
        // up, after a rewind.
        TEST_RECENT.with(|w| w.set(Some(4)));
        let (mut pushed, mut stepped) = (Recent::new(&both(0, 10), Dtype::Float32).unwrap(), Recent::new(&both(0, 10), Dtype::Float32).unwrap());
        for p in 10..20 {
            if p == 15 {
                pushed.trim(2);
                stepped.trim(2);
            }
            pushed.push(&both(p, p + 1)).unwrap();
            let moves = stepped.step_moves().unwrap();
            let buffer = kernel_step(stepped.buffer(), &both(p, p + 1), moves);
            stepped.stepped(buffer, moves);
            assert_eq!((stepped.filled(), read(&stepped)), (pushed.filled(), read(&pushed)), "position {p}");
        }
        TEST_RECENT.with(|w| w.set(None));
    }

    #[test]
    fn a_batch_window_takes_each_rows_own_positions_over_the_decoded_ones() {
        let decoded = ops::zeros(&[2, 1, 3, 1], Dtype::Float32).unwrap();
        let negated = |x: Array| ops::negative(&x).unwrap();
        let rows = [[positions(5, 7), negated(positions(5, 7))], [positions(0, 0), positions(0, 0)]];
        let r = Recent::from_rows(&rows, [decoded.clone(), decoded]).unwrap();
        assert_eq!(r.held(), 3);
        // Row 0 held its last two exactly, the third comes from codes; row 1 none.
        assert_eq!(read(&r), vec![0.0, 5.0, 6.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn a_prefix_keeps_the_window_positions_before_its_end() {
        // A window of 128 over a row of 1000: positions 872..1000.
        assert_eq!(prefix_len(128, 1000, 1000), 128);
        assert_eq!(prefix_len(128, 1000, 900), 28);
        assert_eq!(prefix_len(128, 1000, 800), 0);
    }
}

//! The storage the growing cache kinds share: per-position tensors ("columns":
//! keys and values, or packed codes, scales and biases) of a batch of
//! sequences, each [B, kv_heads, capacity, X], left-padded to one shared write
//! position — mlx-lm's BatchKVCache layout. Row b's tokens sit at
//! `left_pad[b]..idx`; capacity grows in steps of 256 positions and new
//! positions are written in place with slice updates. One row with no padding
//! is exactly mlx-lm's single-sequence KVCache.

use mlx_rs_safe::{ops, Array};

use super::mask::{padded_causal_mask, AttentionMask, MaskKey, StepMemo};
use super::turbo::kernels;
use crate::error::{Error, Result};

/// Positions allocated at a time.
pub const STEP: i32 = 256;

#[derive(Clone)]
pub struct PaddedRows {
    /// Empty until the first write.
    columns: Vec<Array>,
    /// Positions written, padding included (the same for every row).
    idx: i32,
    left_pad: Vec<i32>,
    /// Positions the next growth makes room for at once (see [`Self::reserve`]).
    reserved: i32,
    /// The decode kernels' split counters for these rows (see [`Self::split_counts`]).
    counts: kernels::SplitCounts,
    /// Grow to exactly the positions written, no room beyond: rows written by
    /// one call and then copied out (prompts prefilled together), whose
    /// buffers would otherwise hold a step of 256 positions a row for nothing.
    exact: bool,
}

/// `a[..., :n, :]` of a [B, H, S, X] array.
fn head(a: &Array, n: i32) -> Result<Array> {
    Ok(ops::slice_axis(a, 2, 0, n)?)
}

impl PaddedRows {
    /// `rows` sequences with no tokens yet.
    pub fn empty(rows: usize) -> PaddedRows {
        PaddedRows { columns: Vec::new(), idx: 0, left_pad: vec![0; rows], reserved: 0, counts: Default::default(), exact: false }
    }

    /// Sequences without tokens whose first writes are `left_pad[b]`
    /// positions of padding each (prompts of several lengths, left-padded to
    /// the longest and prefilled in one call): a row's tokens then start at
    /// position 0 of its own. Their buffers are as long as that call's
    /// tokens (the rows are copied out afterwards).
    pub fn padded_ahead(left_pad: Vec<i32>) -> PaddedRows {
        PaddedRows { columns: Vec::new(), idx: 0, left_pad, reserved: 0, counts: Default::default(), exact: true }
    }

    /// One sequence over `columns` ([1, H, len, X] each: views of another
    /// cache's rows), without copying them: the first write past them grows
    /// into buffers of its own.
    pub fn over_row(columns: Vec<Array>) -> PaddedRows {
        let idx = columns.first().map_or(0, |c| c.shape()[2]);
        PaddedRows { columns, idx, left_pad: vec![0], reserved: 0, counts: Default::default(), exact: false }
    }

    pub fn rows(&self) -> usize {
        self.left_pad.len()
    }

    /// Tokens each row holds.
    pub fn offsets(&self) -> Vec<i32> {
        self.left_pad.iter().map(|p| self.idx - p).collect()
    }

    /// Positions written, padding included (the same for every row).
    pub fn written(&self) -> i32 {
        self.idx
    }

    /// Tokens row `b` holds.
    pub fn offset(&self, b: usize) -> Result<i32> {
        self.left_pad.get(b).map(|p| self.idx - p).ok_or(Error::Internal("a cache row out of range"))
    }

    /// The whole buffers, unused capacity included (what mlx-lm quantizes when
    /// it converts a cache).
    pub fn buffers(&self) -> &[Array] {
        &self.columns
    }

    /// Padding in front of each row.
    pub fn left_pad(&self) -> &[i32] {
        &self.left_pad
    }

    /// The same layout over other columns (a compressed form of these), whose
    /// rows start `skip` positions later (those are kept elsewhere).
    pub fn with_buffers(&self, columns: Vec<Array>, skip: i32) -> PaddedRows {
        PaddedRows { columns, idx: self.idx, left_pad: self.left_pad.iter().map(|p| p + skip).collect(), reserved: 0, counts: Default::default(), exact: false }
    }

    /// The mask for `n` new tokens attending to what is stored plus themselves.
    pub fn mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        padded_causal_mask(n, self.idx, window, &self.left_pad)
    }

    /// What [`Self::mask`] depends on.
    pub fn mask_key(&self, kind: &'static str, n: i32, window: Option<i32>) -> MaskKey {
        let mut layout = vec![self.idx, n, window.unwrap_or(-1)];
        layout.extend(&self.left_pad);
        MaskKey { kind, layout }
    }

    /// The decode kernels' scalars for these rows ([`kernels::step_params`]:
    /// positions written, `scale`, each row's first position), made once a
    /// step for every layer whose rows are laid out alike.
    pub fn step_params(&self, scale: f32, masks: &StepMemo) -> Result<Array> {
        self.step_params_to(self.idx, scale, masks)
    }

    /// The counters a CUDA decode-attention launch over these rows counts its
    /// finished splits in ([`kernels::SplitCounts`]): one per row and KV head,
    /// kept for every launch of this cache.
    pub fn split_counts(&mut self) -> Result<Array> {
        let kv_heads = self.columns.first().ok_or(Error::Internal("split counters for a cache without columns"))?.dim(1)?;
        self.counts.for_groups(self.rows() as i32 * kv_heads)
    }

    /// [`Self::step_params`] for the positions before `end` only.
    pub fn step_params_to(&self, end: i32, scale: f32, masks: &StepMemo) -> Result<Array> {
        let mut layout = vec![end, scale.to_bits() as i32];
        layout.extend(&self.left_pad);
        masks.array(MaskKey { kind: "kernel-params", layout }, || kernels::step_params(end, scale, &self.left_pad))
    }

    /// Makes the next growth room for `positions` in all (a prompt prefilled
    /// chunk by chunk): its later chunks are written in place, where growing
    /// a chunk at a time copies every column into a larger buffer per chunk
    /// (the old one held until the chunk's work is done: memory, and time,
    /// that grow with the prompt).
    pub fn reserve(&mut self, positions: i32) {
        self.reserved = positions;
    }

    /// Writes `new` ([B, H, L, X] per column) after every row's tokens and
    /// returns the columns up to the new write position.
    pub fn append(&mut self, new: &[Array]) -> Result<Vec<Array>> {
        let l = new.first().map(|a| a.shape()[2]).unwrap_or(0);
        let prev = self.idx;
        let capacity = self.columns.first().map(|c| c.shape()[2]).unwrap_or(0);
        if self.columns.is_empty() || prev + l > capacity {
            let steps = |n: i32| if self.exact { n } else { (STEP + n - 1) / STEP * STEP };
            let grow = steps(l).max(steps(self.reserved - prev));
            let mut grown = Vec::with_capacity(new.len());
            for (i, n) in new.iter().enumerate() {
                let s = n.shape();
                let zeros = ops::zeros(&[s[0], s[1], grow, s[3]], n.dtype())?;
                grown.push(match self.columns.get(i) {
                    Some(c) => {
                        let c = if prev % STEP != 0 { head(c, prev)? } else { c.clone() };
                        ops::concatenate(&[&c, &zeros], 2)?
                    }
                    None => zeros,
                });
            }
            self.columns = grown;
        }
        self.idx += l;
        let mut views = Vec::with_capacity(new.len());
        for (c, n) in self.columns.iter_mut().zip(new) {
            let s = c.shape();
            *c = ops::slice_update(c, n, &[0, 0, prev, 0], &[s[0], s[1], self.idx, s[3]], &[1, 1, 1, 1])?;
            views.push(if self.idx < s[2] { head(c, self.idx)? } else { c.clone() });
        }
        Ok(views)
    }

    /// Row `b`'s columns without padding: [1, H, len_b, X] each (none when the
    /// cache is still empty).
    pub fn row(&self, b: usize) -> Result<Vec<Array>> {
        let start = *self.left_pad.get(b).ok_or(Error::Internal("a cache row out of range"))?;
        let b = b as i32;
        self.columns
            .iter()
            .map(|c| {
                let s = c.shape();
                Ok(ops::slice(c, &[b, 0, start, 0], &[b + 1, s[1], self.idx, s[3]], &[1, 1, 1, 1])?)
            })
            .collect()
    }

    /// A batch of these rows (each [1, H, len, X] per column, or no columns for
    /// a row without tokens), left-padded to the longest, with room to grow.
    pub fn from_rows(rows: &[Vec<Array>]) -> Result<PaddedRows> {
        let lens: Vec<i32> = rows.iter().map(|r| r.first().map(|a| a.shape()[2]).unwrap_or(0)).collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let left_pad: Vec<i32> = lens.iter().map(|l| longest - l).collect();
        let Some(model_row) = rows.iter().find(|r| !r.is_empty()) else {
            return Ok(PaddedRows::empty(rows.len()));
        };
        // Rounded up past the longest row, so the next tokens are written in place.
        let capacity = (longest / STEP + 1) * STEP;
        let b = rows.len() as i32;
        let mut columns = Vec::with_capacity(model_row.len());
        for (i, like) in model_row.iter().enumerate() {
            let s = like.shape();
            let mut buf = ops::zeros(&[b, s[1], capacity, s[3]], like.dtype())?;
            for (r, (row, pad)) in rows.iter().zip(&left_pad).enumerate() {
                let Some(col) = row.get(i) else { continue };
                let r = r as i32;
                buf = ops::slice_update(&buf, col, &[r, 0, *pad, 0], &[r + 1, s[1], longest, s[3]], &[1, 1, 1, 1])?;
            }
            columns.push(buf);
        }
        Ok(PaddedRows { columns, idx: longest, left_pad, reserved: 0, counts: Default::default(), exact: false })
    }

    /// Drops `n` positions from the end of every row (at most the shortest
    /// row's tokens); returns how many were dropped.
    pub fn trim(&mut self, n: i32) -> i32 {
        let shortest = self.offsets().into_iter().min().unwrap_or(0);
        let n = n.clamp(0, shortest);
        self.idx -= n;
        n
    }

    pub fn nbytes(&self) -> usize {
        self.columns.iter().map(Array::nbytes).sum()
    }

    pub fn arrays(&self) -> Vec<Array> {
        self.columns.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::values;
    use mlx_rs_safe::Dtype;

    /// [1, 1, len, 2] with values start, start+1, ...
    fn row(start: f32, len: i32) -> Array {
        let v: Vec<f32> = (0..len * 2).map(|i| start + i as f32).collect();
        Array::from_slice(&v, &[1, 1, len, 2]).unwrap()
    }

    #[test]
    fn rows_of_different_lengths_come_back_without_their_padding() {
        let rows = vec![vec![row(0.0, 3)], vec![row(100.0, 5)], vec![]];
        let p = PaddedRows::from_rows(&rows).unwrap();
        assert_eq!(p.offsets(), vec![3, 5, 0]);
        assert_eq!(values(&p.row(0).unwrap()[0]), values(&row(0.0, 3)));
        assert_eq!(values(&p.row(1).unwrap()[0]), values(&row(100.0, 5)));
        assert_eq!(p.row(2).unwrap()[0].shape(), vec![1, 1, 0, 2]);
    }

    #[test]
    fn appending_writes_after_every_row_and_grows_past_the_capacity() {
        let mut p = PaddedRows::from_rows(&[vec![row(0.0, 2)], vec![row(10.0, 4)]]).unwrap();
        let new = Array::from_slice(&[7.0f32, 7.0, 8.0, 8.0], &[2, 1, 1, 2]).unwrap();
        let views = p.append(&[new]).unwrap();
        assert_eq!(views[0].shape(), vec![2, 1, 5, 2]);
        assert_eq!(p.offsets(), vec![3, 5]);
        assert_eq!(values(&p.row(0).unwrap()[0]), vec![0.0, 1.0, 2.0, 3.0, 7.0, 7.0]);
        // 300 more positions cross the first allocation.
        let many = ops::zeros(&[2, 1, 300, 2], Dtype::Float32).unwrap();
        p.append(&[many]).unwrap();
        assert_eq!(p.offsets(), vec![303, 305]);
        assert!(p.buffers()[0].shape()[2] >= 305);
        assert_eq!(values(&p.row(1).unwrap()[0])[..8], [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]);
    }

    #[test]
    fn a_reserved_prompt_grows_the_buffers_once() {
        let chunk = |v: f32| ops::full(&[1, 1, 300, 2], &Array::scalar(v), Dtype::Float32).unwrap();
        let (mut plain, mut reserved) = (PaddedRows::empty(1), PaddedRows::empty(1));
        reserved.reserve(900);
        let mut capacities = (vec![], vec![]);
        for v in [1.0, 2.0, 3.0] {
            plain.append(&[chunk(v)]).unwrap();
            reserved.append(&[chunk(v)]).unwrap();
            capacities.0.push(plain.buffers()[0].shape()[2]);
            capacities.1.push(reserved.buffers()[0].shape()[2]);
        }
        // A chunk at a time the buffers grow (a copy each); reserved, once.
        assert_eq!(capacities, (vec![512, 812, 1112], vec![1024, 1024, 1024]));
        assert_eq!(values(&reserved.row(0).unwrap()[0]), values(&plain.row(0).unwrap()[0]));
        // Past the reservation it grows a step at a time again.
        reserved.append(&[ops::zeros(&[1, 1, 200, 2], Dtype::Float32).unwrap()]).unwrap();
        assert_eq!((reserved.offsets(), reserved.buffers()[0].shape()[2]), (vec![1100], 1156));
    }

    #[test]
    fn prompts_padded_ahead_hold_exactly_their_call_and_come_back_as_views() {
        // Two prompts of 4 and 2 tokens in one call, the second after 2 positions of padding.
        let mut p = PaddedRows::padded_ahead(vec![0, 2]);
        assert_eq!(p.offsets(), vec![0, -2]);
        // Causal; the second row's tokens never see its padding, whose queries keep only their own key.
        let AttentionMask::Array(m) = p.mask(4, None).unwrap() else { panic!("padding needs a mask") };
        let keep = ops::astype(&m, Dtype::Int32).unwrap().to_vec::<i32>().unwrap();
        assert_eq!(keep[..16], [1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1]);
        assert_eq!(keep[16..], [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1]);
        let call: Vec<f32> = (0..16).map(|i| i as f32).collect();
        p.append(&[Array::from_slice(&call, &[2, 1, 4, 2]).unwrap()]).unwrap();
        assert_eq!((p.offsets(), p.buffers()[0].shape()[2]), (vec![4, 2], 4), "no room past the call");
        let second = p.row(1).unwrap();
        assert_eq!(values(&second[0]), vec![12.0, 13.0, 14.0, 15.0]);
        // Its own cache over the view grows when it is written past it.
        let mut own = PaddedRows::over_row(second);
        assert_eq!(own.offsets(), vec![2]);
        own.append(&[Array::from_slice(&[7.0f32, 7.0], &[1, 1, 1, 2]).unwrap()]).unwrap();
        assert_eq!(own.offsets(), vec![3]);
        assert_eq!(values(&own.row(0).unwrap()[0]), vec![12.0, 13.0, 14.0, 15.0, 7.0, 7.0]);
        assert_eq!(values(&p.row(1).unwrap()[0]), vec![12.0, 13.0, 14.0, 15.0], "the call's buffers are untouched");
    }

    #[test]
    fn trim_drops_the_newest_positions_of_every_row_but_never_below_the_shortest() {
        let mut p = PaddedRows::from_rows(&[vec![row(0.0, 2)], vec![row(10.0, 4)]]).unwrap();
        assert_eq!(p.trim(1), 1);
        assert_eq!(p.offsets(), vec![1, 3]);
        assert_eq!(p.trim(5), 1);
        assert_eq!(p.offsets(), vec![0, 2]);
        assert_eq!(values(&p.row(1).unwrap()[0]), vec![10.0, 11.0, 12.0, 13.0]);
    }

    #[test]
    fn the_padding_mask_hides_each_rows_padding_only() {
        let p = PaddedRows::from_rows(&[vec![row(0.0, 1)], vec![row(10.0, 3)]]).unwrap();
        let AttentionMask::Array(m) = p.mask(1, None).unwrap() else { panic!("padding needs a mask") };
        assert_eq!(m.shape(), vec![2, 1, 1, 4]);
        let keep = ops::astype(&m, Dtype::Int32).unwrap().to_vec::<i32>().unwrap();
        assert_eq!(keep, vec![0, 0, 1, 1, 1, 1, 1, 1]);
        let single = PaddedRows::from_rows(&[vec![row(0.0, 3)]]).unwrap();
        assert!(matches!(single.mask(1, None).unwrap(), AttentionMask::None));
        assert!(matches!(single.mask(4, None).unwrap(), AttentionMask::Causal));
    }
}

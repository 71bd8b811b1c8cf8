//! Every cache kind against itself: a row decoded inside a batch (joining,
//! leaving, beside rows of other lengths) attends exactly as it does alone;
//! trimming and restoring a row continue as if nothing happened.

use mlx_rs_safe::{ops, random, Array, Dtype};

use super::turbo::SINKS;
use super::values;
use super::{AttendArgs, CompressAt, KvCompression, KvKind, KvSnapshot, LayerCache, ModelCache, StepMemo, Phase, TurboPreset};

const Q_HEADS: i32 = 4;
const KV_HEADS: i32 = 2;
const DIM: i32 = 32;

/// Every kind, TurboQuant's with a recent window of 5 positions on this
/// thread (128 in use), so these short rows cross it: their newest positions
/// read unquantized, the older ones from codes.
fn kinds() -> Vec<KvKind> {
    super::turbo::TEST_RECENT.with(|w| w.set(Some(5)));
    let mut kinds = vec![KvKind::Dense, KvKind::Rotating { max_size: 8 }, KvKind::Affine { group_size: 32, bits: 8 }];
    for preset in TurboPreset::ALL {
        kinds.push(KvKind::Turbo(preset.format(2, 8, 3)));
    }
    kinds
}

/// A row's queries, keys and values at every position: [1, H, len, D] each.
struct Row {
    q: Array,
    k: Array,
    v: Array,
}

fn normal(shape: &[i32], seed: u64) -> Array {
    random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed).unwrap()).unwrap()
}

fn row(len: i32, seed: u64) -> Row {
    Row {
        q: normal(&[1, Q_HEADS, len, DIM], seed),
        k: normal(&[1, KV_HEADS, len, DIM], seed + 1),
        v: normal(&[1, KV_HEADS, len, DIM], seed + 2),
    }
}

fn at(a: &Array, from: i32, to: i32) -> Array {
    ops::slice_axis(a, 2, from, to).unwrap()
}

fn args() -> AttendArgs<'static> {
    AttendArgs { scale: (DIM as f32).powf(-0.5), window: None, sinks: None, keep: false }
}

/// Attends row `r`'s positions `from..to` (one chunk) in `cache`.
fn feed(cache: &mut LayerCache, r: &Row, from: i32, to: i32) -> Array {
    cache.attend(&at(&r.q, from, to), &at(&r.k, from, to), &at(&r.v, from, to), &args(), &StepMemo::default()).unwrap()
}

/// One decode step of a batch: row i of the batch feeds `rows[i]` at `pos[i]`.
fn step(cache: &mut LayerCache, rows: &[&Row], pos: &[i32]) -> Vec<Array> {
    let pick = |f: fn(&Row) -> &Array| -> Array {
        let parts: Vec<Array> = rows.iter().zip(pos).map(|(r, &p)| at(f(r), p, p + 1)).collect();
        ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0).unwrap()
    };
    let out = cache.attend(&pick(|r| &r.q), &pick(|r| &r.k), &pick(|r| &r.v), &args(), &StepMemo::default()).unwrap();
    (0..rows.len() as i32).map(|b| ops::slice_axis(&out, 0, b, b + 1).unwrap()).collect()
}

fn assert_close(a: &Array, b: &Array, what: &str) {
    let (a, b) = (values(a), values(b));
    assert_eq!(a.len(), b.len(), "{what}: sizes differ");
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(diff < 1e-4, "{what}: differs by {diff}");
}

/// Row `r` alone: `prefill` positions in one chunk, then one position per
/// step up to `len`; the output of each decode step, by position.
fn alone(kind: &KvKind, r: &Row, prefill: i32, len: i32) -> Vec<Option<Array>> {
    let mut cache = prefilled(kind, r, prefill);
    let mut out = vec![None; len as usize];
    for p in prefill..len {
        out[p as usize] = Some(step(&mut cache, &[r], &[p]).remove(0));
    }
    out
}

/// A batch's rows: their data, the next position of each, and their alone outputs.
struct Member<'a> {
    row: &'a Row,
    next: i32,
    want: Vec<Option<Array>>,
}

fn decode(cache: &mut LayerCache, members: &mut [Member], steps: usize, kind: &KvKind) {
    for _ in 0..steps {
        let rows: Vec<&Row> = members.iter().map(|m| m.row).collect();
        let pos: Vec<i32> = members.iter().map(|m| m.next).collect();
        assert_eq!(cache.offsets(), pos, "{kind:?}: each row's offset is its own length");
        for (m, got) in members.iter_mut().zip(step(cache, &rows, &pos)) {
            let want = m.want[m.next as usize].as_ref().unwrap();
            assert_close(&got, want, &format!("{kind:?}: a batched row at position {}", m.next));
            m.next += 1;
        }
    }
}

/// A cache of `kind` holding row `r`'s first `n` positions. A TurboQuant
/// cache is a dense one compressed when decoding starts, as the engine does.
fn prefilled(kind: &KvKind, r: &Row, n: i32) -> LayerCache {
    let KvKind::Turbo(_) = kind else {
        let mut c = LayerCache::new(kind).unwrap();
        feed(&mut c, r, 0, n);
        return c;
    };
    let mut c = LayerCache::new(&KvKind::Dense).unwrap();
    feed(&mut c, r, 0, n);
    c.compress(|k, tokens| (*k == KvKind::Dense && tokens >= SINKS).then_some(*kind)).unwrap();
    c
}

#[test]
fn rows_joining_and_leaving_a_batch_attend_as_they_do_alone() {
    for kind in kinds() {
        let (a, b, c) = (row(40, 10), row(40, 20), row(40, 30));
        let (pa, pb, pc) = (5, 11, 4);
        let mut members =
            vec![Member { row: &a, next: pa, want: alone(&kind, &a, pa, 40) }];
        let mut batch = prefilled(&kind, &a, pa);
        decode(&mut batch, &mut members, 4, &kind);
        batch.extend([prefilled(&kind, &b, pb)]).unwrap();
        members.push(Member { row: &b, next: pb, want: alone(&kind, &b, pb, 40) });
        decode(&mut batch, &mut members, 3, &kind);
        batch.extend([prefilled(&kind, &c, pc)]).unwrap();
        members.push(Member { row: &c, next: pc, want: alone(&kind, &c, pc, 40) });
        decode(&mut batch, &mut members, 6, &kind);
        // The middle row leaves; the others go on past the rotating window.
        batch.filter(&[0, 2]).unwrap();
        members.remove(1);
        decode(&mut batch, &mut members, 12, &kind);
        batch.filter(&[1]).unwrap();
        members.remove(0);
        decode(&mut batch, &mut members, 3, &kind);
    }
}

#[test]
fn rows_joining_a_batch_together_attend_as_they_do_alone() {
    for kind in kinds() {
        let (a, b, c) = (row(30, 60), row(30, 70), row(30, 80));
        let (pa, pb, pc) = (7, 3, 12);
        let mut members = vec![Member { row: &a, next: pa, want: alone(&kind, &a, pa, 30) }];
        let mut batch = prefilled(&kind, &a, pa);
        decode(&mut batch, &mut members, 2, &kind);
        // Two rows of other lengths join in one call, after the row decoding.
        batch.extend([prefilled(&kind, &b, pb), prefilled(&kind, &c, pc)]).unwrap();
        members.push(Member { row: &b, next: pb, want: alone(&kind, &b, pb, 30) });
        members.push(Member { row: &c, next: pc, want: alone(&kind, &c, pc, 30) });
        decode(&mut batch, &mut members, 10, &kind);
        // Into an empty batch: the first takes its place, the rest join it.
        let mut empty = LayerCache::new(&KvKind::Dense).unwrap();
        empty.filter(&[]).unwrap();
        assert_eq!(empty.rows(), 0);
        empty.extend([prefilled(&kind, &c, pc), prefilled(&kind, &a, pa)]).unwrap();
        let mut members = vec![
            Member { row: &c, next: pc, want: alone(&kind, &c, pc, 30) },
            Member { row: &a, next: pa, want: alone(&kind, &a, pa, 30) },
        ];
        decode(&mut empty, &mut members, 5, &kind);
    }
}

#[test]
fn a_restored_row_continues_as_the_original() {
    for kind in kinds() {
        let (a, b) = (row(30, 40), row(30, 50));
        let mut batch = prefilled(&kind, &a, 6);
        batch.extend([prefilled(&kind, &b, 9)]).unwrap();
        let mut pos = [6, 9];
        for _ in 0..12 {
            step(&mut batch, &[&a, &b], &pos);
            pos = [pos[0] + 1, pos[1] + 1];
        }
        let saved = batch.row(1).unwrap();
        assert_eq!(saved.offset, 21);
        let mut restored = LayerCache::from_rows(&[saved]).unwrap();
        for _ in 0..5 {
            let want = step(&mut batch, &[&a, &b], &pos).remove(1);
            let got = step(&mut restored, &[&b], &[pos[1]]).remove(0);
            assert_close(&got, &want, &format!("{kind:?}: the restored row"));
            pos = [pos[0] + 1, pos[1] + 1];
        }
    }
}

#[test]
fn trimmed_positions_are_forgotten_and_can_be_written_again() {
    for kind in kinds() {
        let (a, b) = (row(12, 60), row(12, 70));
        let mut batch = prefilled(&kind, &a, 4);
        batch.extend([prefilled(&kind, &b, 6)]).unwrap();
        let first = step(&mut batch, &[&a, &b], &[4, 6]);
        step(&mut batch, &[&a, &b], &[5, 7]);
        assert_eq!(batch.trim(2).unwrap(), 2);
        assert_eq!(batch.offsets(), vec![4, 6]);
        let again = step(&mut batch, &[&a, &b], &[4, 6]);
        for (g, w) in again.iter().zip(&first) {
            assert_close(g, w, &format!("{kind:?}: after trim"));
        }
    }
}

/// What a speculative decode step relies on: where a cache gives an undo
/// point, a step of wrong keys and values, undone, then the right one attends
/// as if the wrong one never happened, also once a sliding window's write
/// overwrites a position it keeps; undone with nothing appended, nothing
/// changes.
#[test]
fn a_step_a_cache_can_undo_leaves_no_trace() {
    for kind in kinds() {
        let (a, wrong) = (row(16, 90), row(16, 95));
        // Past the sinks, so a TurboQuant cache is compressed from the start.
        let want = alone(&kind, &a, 5, 16);
        let mut cache = prefilled(&kind, &a, 5);
        assert_eq!(cache.row(0).unwrap().kind, kind, "the cache under test is of its kind");
        let mut undone = 0;
        for p in 5..16 {
            // Undone with nothing appended (a layer that read another's cache): no change.
            let idle = cache.undo_point(1).unwrap_or_else(|| panic!("{kind:?}: no undo point at {p}"));
            cache.undo(&idle).unwrap();
            let point = cache.undo_point(1).unwrap_or_else(|| panic!("{kind:?}: no undo point at {p}"));
            step(&mut cache, &[&wrong], &[p]);
            cache.undo(&point).unwrap();
            assert_eq!(cache.offsets(), vec![p], "{kind:?}: undone at {p}");
            undone += 1;
            let got = step(&mut cache, &[&a], &[p]).remove(0);
            assert_close(&got, want[p as usize].as_ref().unwrap(), &format!("{kind:?}: position {p} after an undone step"));
        }
        assert_eq!(undone, 11, "{kind:?}");
    }
}

#[test]
fn a_rotating_cache_that_dropped_positions_refuses_to_trim() {
    let a = row(20, 80);
    let mut cache = prefilled(&KvKind::Rotating { max_size: 8 }, &a, 3);
    for p in 3..12 {
        step(&mut cache, &[&a], &[p]);
    }
    assert!(cache.trim(1).is_err());
}

#[test]
fn rows_crossing_the_quantization_start_at_different_steps_match_each_row_alone() {
    let policy = KvCompression::affine(8, 32, 10).unwrap();
    let at = CompressAt { layer: 0, layers: 1, phase: Phase::Decode };
    let target = |k: &KvKind, n: i32| policy.target(k, n, at);
    let (a, b) = (row(24, 90), row(24, 100));
    // Alone: each row converted after the step that took it to 10 tokens.
    let alone_with_policy = |r: &Row, prefill: i32| -> Vec<Option<Array>> {
        let mut c = prefilled(&KvKind::Dense, r, prefill);
        c.compress(target).unwrap();
        let mut out = vec![None; 24];
        for p in prefill..24 {
            out[p as usize] = Some(step(&mut c, &[r], &[p]).remove(0));
            c.compress(target).unwrap();
        }
        out
    };
    let mut members = vec![
        Member { row: &a, next: 4, want: alone_with_policy(&a, 4) },
        Member { row: &b, next: 8, want: alone_with_policy(&b, 8) },
    ];
    let mut batch = prefilled(&KvKind::Dense, &a, 4);
    batch.extend([prefilled(&KvKind::Dense, &b, 8)]).unwrap();
    for _ in 0..14 {
        decode(&mut batch, &mut members, 1, &KvKind::Dense);
        batch.compress(target).unwrap();
    }
    assert_eq!(batch.row(0).unwrap().kind, KvKind::Affine { group_size: 32, bits: 8 });
}

#[test]
fn a_rotating_row_restores_only_prefixes_whose_window_it_still_holds() {
    let kind = KvKind::Rotating { max_size: 8 };
    let a = row(20, 110);
    let mut cache = prefilled(&kind, &a, 4);
    for p in 4..15 {
        step(&mut cache, &[&a], &[p]);
    }
    let saved = cache.row(0).unwrap();
    assert_eq!((saved.offset, saved.columns[0].shape()[2]), (15, 8));
    // Holds positions 7..15: 15 itself, and 14 (whose 7-position window 7..14 is kept).
    assert_eq!(saved.servable(20), 15);
    assert_eq!(saved.servable(14), 14);
    assert_eq!(saved.servable(13), 0);
    let cut = saved.prefix(14).unwrap();
    assert_eq!((cut.offset, cut.columns[0].shape()[2]), (14, 7));
    let dense = prefilled(&KvKind::Dense, &a, 15).row(0).unwrap();
    assert_eq!(dense.servable(9), 9);
}

#[test]
fn a_prompt_reserves_its_room_once_and_a_compressing_policy_keeps_the_16_bit_store_small() {
    let r = row(640, 70);
    let bytes_per_position = 2 * KV_HEADS as usize * DIM as usize * 4;
    let turbo = KvCompression::turbo("balanced", 256).unwrap();
    for (policy, room) in [(None, 640), (Some(&turbo), 256)] {
        let mut cache = super::ModelCache::new(&[KvKind::Dense]).unwrap();
        cache.reserve(640, policy);
        let mut chunked = Vec::new();
        {
            let (layers, _) = cache.for_forward();
            chunked.push(feed(&mut layers[0], &r, 0, 128));
        }
        // The 16-bit store holds the prompt, or what comes before the policy converts it.
        assert_eq!(cache.nbytes(), (room as usize).div_ceil(256) * 256 * bytes_per_position, "{policy:?}");
        let (layers, _) = cache.for_forward();
        chunked.push(feed(&mut layers[0], &r, 128, 256));
        // The same attention as a store grown a chunk at a time.
        let mut plain = LayerCache::new(&KvKind::Dense).unwrap();
        assert_close(&chunked[0], &feed(&mut plain, &r, 0, 128), "first chunk");
        assert_close(&chunked[1], &feed(&mut plain, &r, 128, 256), "second chunk");
    }
}

#[test]
fn joining_and_leaving_a_batch_copies_one_layer_at_a_time() {
    // Eight layers of 16-bit rows, 1024 positions of [2 heads x 32] floats
    // each: 0.5 MiB a layer per row.
    let layers = 8;
    let sequence = |seed| {
        let r = row(1024, seed);
        let layer = prefilled(&KvKind::Dense, &r, 1024).row(0).unwrap();
        ModelCache::restore(&KvSnapshot { layers: vec![layer; layers] }).unwrap()
    };
    let settled = |c: &ModelCache| mlx_rs_safe::eval(&c.state().iter().collect::<Vec<_>>()).unwrap();
    let mut batch = sequence(1);
    batch.extend([sequence(4)]).unwrap();
    let joining = sequence(7);
    settled(&batch);
    settled(&joining);
    let grew_by = |before: usize| mlx_rs_safe::memory::peak_memory().unwrap().saturating_sub(before);
    let before = mlx_rs_safe::memory::active_memory().unwrap();
    mlx_rs_safe::memory::reset_peak_memory().unwrap();
    batch.extend([joining]).unwrap();
    settled(&batch);
    // The rebuilt batch holds three rows; at most one layer's worth of it is
    // held beside the old rows (with room for its capacity rounding), not
    // every layer's.
    let join = grew_by(before);
    assert_eq!(batch.rows(), 3);
    let per_layer = batch.nbytes() / layers;
    assert!(join < 3 * per_layer, "a join took {join} bytes beyond the rows; one layer of the batch is {per_layer}");
    let before = mlx_rs_safe::memory::active_memory().unwrap();
    mlx_rs_safe::memory::reset_peak_memory().unwrap();
    batch.filter(&[0, 2]).unwrap();
    settled(&batch);
    let leave = grew_by(before);
    assert!(leave < 3 * per_layer, "a row leaving took {leave} bytes beyond the rows; one layer of the batch is {per_layer}");
}

#[test]
fn turbo_rows_reading_their_history_block_by_block_attend_as_with_it_read_whole() {
    // Where attention is unfused (the CPU), 8-position blocks: a prefill
    // chunk past its history (one row, causal) and rows of other lengths
    // decoding together (a padding mask) attend as they do with the history
    // read whole in one call.
    use super::turbo::blocked::TEST_BLOCK;
    if !super::turbo::blocked::applies_here() {
        return eprintln!("skipped: a GPU reads the history with its kernels");
    }
    for preset in TurboPreset::ALL {
        let kind = KvKind::Turbo(preset.format(2, 8, 3));
        let (a, b) = (row(60, 200), row(60, 210));
        let run = |block: Option<i32>| -> Vec<Array> {
            TEST_BLOCK.with(|t| t.set(block));
            let mut batch = prefilled(&kind, &a, 20);
            let mut out = vec![feed(&mut batch, &a, 20, 26)];
            batch.extend([prefilled(&kind, &b, 33)]).unwrap();
            for i in 0..10 {
                out.extend(step(&mut batch, &[&a, &b], &[26 + i, 33 + i]));
            }
            TEST_BLOCK.with(|t| t.set(None));
            out
        };
        let (whole, blocks) = (run(None), run(Some(8)));
        for (i, (w, bl)) in whole.iter().zip(&blocks).enumerate() {
            assert_close(bl, w, &format!("{preset:?}, output {i}"));
        }
    }
}

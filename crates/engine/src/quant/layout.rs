//! How a matrix with kernels of our own holds its weights: one layout per format and
//! CPU, chosen once at load ([`lay_out`], the only place that choice is made), each
//! behind the one [`Layout`] trait that multiplies a chunk of its rows.
//!
//! The layouts, and the modules that hold them with their kernels:
//! - Q8_0, Q4_1, Q5_0, Q4_0, Q5_1 and IQ4_NL (Q4_0 and IQ4_NL with llama.cpp's repacked
//!   arithmetic) interleaved sixteen rows to a vector where the CPU has AVX2 (kernels for
//!   AVX-512 VNNI, and for AVX2 eight rows at a time): `block_lanes`;
//! - block-of-32 formats (Q4_0 with rows not a multiple of eight, and the others
//!   elsewhere) repacked eight rows at a time: `packed` (portable) and `packed_simd`
//!   (AVX2, AVX-512 VNNI);
//! - Q4_K and Q6_K interleaved sixteen rows to a vector where the CPU has AVX2 (kernels
//!   for AVX-512 VNNI, and for AVX2 alone eight rows at a time): `q4k_lanes`, `q6k_lanes`;
//! - Q5_K and IQ4_XS two rows to a vector with AVX-512 VNNI (`pair_lanes`); with AVX2
//!   alone they, and Q2_K and Q3_K wherever the CPU has AVX2, sixteen rows to a vector
//!   (`k_lanes`: kernels for AVX-512 VNNI, Q2_K's and Q3_K's, and for AVX2 eight rows at a
//!   time);
//! - every other quantized format, and these on other CPUs, row after row: `rows`
//!   (portable kernels in `kquant`, `dot`, `iq4`);
//! - F32, F16 and BF16 row after row: `float_rows` (portable `float`, AVX-512 or AVX2
//!   `float_simd`).
//!
//! However a matrix is laid out, each row's arithmetic is that of its format's portable
//! kernel (the bit-identity tests of each module), so the choice changes speed only.

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::act_tile::Line;
use super::block_lanes::{BlockLanes, LaneFormat};
use super::dot::BlockFormat;
use super::float_rows::FloatRows;
use super::k_lanes::{KLaneFormat, KLanes};
use super::output::Columns;
use super::packed::PackedRows;
use super::pair_lanes::{PairFormat, PairLanes};
use super::q4k_lanes::Q4kLanes;
use super::q6k_lanes::Q6kLanes;
use super::rows::RowMajor;
use super::{kquant, Activations, OwnFormat, RowKernel};
#[cfg(target_arch = "x86_64")]
use crate::simd::prefetch::Upcoming;

/// A weight matrix laid out for its kernels, and those kernels.
pub(super) trait Layout: Send + Sync {
    /// Output features `range` (within one chunk of [`super::CHUNK`], starting at a
    /// multiple of it) for every activation row of `acts`, one per entry of `kernels`,
    /// written into `out`. `acts` are quantized as the matrix's format takes them
    /// ([`super::ActivationKind::of`]).
    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns);

    /// Whether its chunks read a prompt's Q8 activations as tiles (`act_tile`): only the
    /// eight-row block-of-32 layout does, so the tiles are built only for products that
    /// have such a matrix.
    fn reads_act_tiles(&self) -> bool {
        false
    }

    /// Asks for its weights' memory to be backed by huge pages
    /// ([`crate::huge_pages::back`]).
    fn back_with_huge_pages(&self);
}

/// `rows × cols` weights of `format` (raw blocks, row after row, sizes already checked)
/// laid out for this CPU's kernels, its memory in huge pages where the system allows.
pub(super) fn lay_out(format: OwnFormat, data: &[u8], rows: usize, cols: usize) -> Box<dyn Layout> {
    let laid = choose(format, data, rows, cols);
    laid.back_with_huge_pages();
    laid
}

/// [`lay_out`]'s choice of layout.
fn choose(format: OwnFormat, data: &[u8], rows: usize, cols: usize) -> Box<dyn Layout> {
    let blocks = cols / kquant::QK_K;
    match format {
        OwnFormat::Blocks(f @ (BlockFormat::Q8_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0))
            if crate::simd::avx2() =>
        {
            Box::new(BlockLanes::new(f.into(), data, rows, cols))
        }
        OwnFormat::Blocks(f) => Box::new(PackedRows::new(f, data, rows, cols)),
        OwnFormat::Q4_0Repacked if crate::simd::avx2() => {
            Box::new(BlockLanes::new(LaneFormat::Q4_0, data, rows, cols))
        }
        OwnFormat::Q5_1 if crate::simd::avx2() => {
            Box::new(BlockLanes::new(LaneFormat::Q5_1, data, rows, cols))
        }
        OwnFormat::Iq4NlRepacked if crate::simd::avx2() => {
            Box::new(BlockLanes::new(LaneFormat::Iq4Nl, data, rows, cols))
        }
        OwnFormat::Q4K if crate::simd::avx2() => Box::new(Q4kLanes::new(data, rows, blocks)),
        OwnFormat::Q6K if crate::simd::avx2() => Box::new(Q6kLanes::new(data, rows, blocks)),
        OwnFormat::Q5K if crate::simd::vnni() => {
            Box::new(PairLanes::new(PairFormat::Q5K, data, rows, blocks))
        }
        OwnFormat::Iq4Xs if crate::simd::vnni() => {
            Box::new(PairLanes::new(PairFormat::Iq4Xs, data, rows, blocks))
        }
        OwnFormat::Q2KRepacked if crate::simd::avx2() => {
            Box::new(KLanes::new(KLaneFormat::Q2K, data, rows, blocks))
        }
        OwnFormat::Q3K if crate::simd::avx2() => {
            Box::new(KLanes::new(KLaneFormat::Q3K, data, rows, blocks))
        }
        OwnFormat::Q5K if crate::simd::avx2() => {
            Box::new(KLanes::new(KLaneFormat::Q5K, data, rows, blocks))
        }
        OwnFormat::Iq4Xs if crate::simd::avx2() => {
            Box::new(KLanes::new(KLaneFormat::Iq4Xs, data, rows, blocks))
        }
        OwnFormat::F32 => Box::new(FloatRows::<f32>::new(data, cols)),
        OwnFormat::F16 => Box::new(FloatRows::<half::f16>::new(data, cols)),
        OwnFormat::Bf16 => Box::new(FloatRows::<half::bf16>::new(data, cols)),
        OwnFormat::Iq4Xs
        | OwnFormat::Iq4NlRepacked
        | OwnFormat::Q2KRepacked
        | OwnFormat::Q3K
        | OwnFormat::Q4K
        | OwnFormat::Q5K
        | OwnFormat::Q6K
        | OwnFormat::Q4_0Repacked
        | OwnFormat::Q5_1 => Box::new(RowMajor::new(format, data, cols)),
    }
}

/// Weight rows per group of the interleaved K-quant layouts (one per 512-bit lane).
pub(super) const LANE_ROWS: usize = crate::simd::LANES_512;

/// Runs `dot(g, pass, soon)` (the sixteen weight rows of interleaved group `g` by the
/// activation rows `pass`, at most `per_pass` (≤ 4) of them, results `[k][lane]`) over the
/// groups that overlap the chunk `range`, for the activation rows `rows`, and writes the
/// chunk's results. A group's passes come one after another, so `dot` may keep what it
/// prepared for the group.
///
/// `soon` is what the pass asks the memory for over its `steps` steps (the kernel's
/// loop over a group, [`Upcoming`]): a part of the next group's lines (`group(g + 1)`,
/// within the chunk), none in a group's first pass, which streams the group itself, and
/// consecutive parts in the later ones (equal, but for a shorter or empty last one).
#[cfg(target_arch = "x86_64")]
pub(super) fn lane_groups<'m>(
    out: &Columns,
    range: Range<usize>,
    rows: &[usize],
    per_pass: usize,
    (group, steps): (impl Fn(usize) -> &'m [Line], usize),
    mut dot: impl FnMut(usize, &[usize], Upcoming) -> [[f32; LANE_ROWS]; 4],
) {
    assert!((1..=4).contains(&per_pass));
    let groups = range.start / LANE_ROWS..range.end.div_ceil(LANE_ROWS);
    let passes = rows.len().div_ceil(per_pass);
    // Lines a later pass asks for, and a step of it (the divisions once per product: a
    // division per pass cost a prompt's products 8%).
    let part = match passes > 1 && !groups.is_empty() {
        true => group(groups.start).len().div_ceil(passes - 1),
        false => 0,
    };
    let per_step = part.div_ceil(steps.max(1));
    for g in groups.clone() {
        let next = match passes > 1 && g + 1 < groups.end {
            true => group(g + 1),
            false => &[],
        };
        for (k, pass) in rows.chunks(per_pass).enumerate() {
            let soon = match k {
                0 => Upcoming::NONE,
                _ => {
                    let from = ((k - 1) * part).min(next.len());
                    Upcoming::new(&next[from..(from + part).min(next.len())], per_step)
                }
            };
            // The group's first row may come before the chunk's.
            let first = (g * LANE_ROWS).max(range.start);
            for (&t, got) in pass.iter().zip(&dot(g, pass, soon)) {
                out.set_run(t, first, &got[first - g * LANE_ROWS..]);
            }
        }
    }
}

/// [`lane_groups`] for a layout whose kernel follows both of llama.cpp's arithmetic plans
/// (Q3_K, Q5_K, Q6_K and IQ4_XS with AVX2): the rows of wide micro-batches
/// ([`RowKernel::in_wide_batch`]) take its tiled matmul's, `tiled(g, pass, soon)` four
/// activation rows a pass; the others its dot product's, whose eight lanes of a weight row
/// fill the registers, `dot(g, t, soon)` one row `t` a pass.
#[cfg(target_arch = "x86_64")]
pub(super) fn lane_groups_by_plan<'m>(
    out: &Columns,
    range: Range<usize>,
    kernels: &[RowKernel],
    groups: (impl Fn(usize) -> &'m [Line] + Copy, usize),
    tiled: impl FnMut(usize, &[usize], Upcoming) -> [[f32; LANE_ROWS]; 4],
    mut dot: impl FnMut(usize, usize, Upcoming) -> [f32; LANE_ROWS],
) {
    let (wide, alone): (Vec<usize>, Vec<usize>) =
        (0..kernels.len()).partition(|&t| kernels[t].in_wide_batch());
    lane_groups(out, range.clone(), &wide, 4, groups, tiled);
    lane_groups(out, range, &alone, 1, groups, |g, one, soon| {
        let mut got = [[0f32; LANE_ROWS]; 4];
        got[0] = dot(g, one[0], soon);
        got
    });
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::quant::output::Output;
    use crate::simd::prefetch::Upcoming;

    /// Every group's passes come in order; the first asks for nothing and the later ones
    /// for consecutive parts that together are the next group's lines, exactly, and that
    /// the kernel's steps ask for entirely; the chunk's last group and single-pass
    /// products ask for nothing; and every result lands in its place.
    #[test]
    fn later_passes_ask_for_exactly_the_next_group() {
        // Three groups of ten lines; the kernel takes four steps over a group.
        let lines = vec![Line([0; 64]); 30];
        let group = |g: usize| &lines[10 * g..10 * (g + 1)];
        let at = |g: usize, line: usize| lines.as_ptr() as usize + 64 * (10 * g + line);
        let cases = [
            (1usize, 2, 5..48),
            (2, 2, 5..48),
            (3, 2, 5..48),
            (7, 2, 5..48),
            // A chunk from the second group on, ending inside the third.
            (7, 2, 20..44),
            (9, 4, 5..48),
        ];
        for (n, per_pass, range) in cases {
            let rows = 48;
            let mut out = vec![0f32; n * rows];
            let output = Output::new(&mut out, n, rows);
            // SAFETY: the only columns.
            let columns = unsafe { output.columns(range.clone()) };
            let rows_of: Vec<usize> = (0..n).collect();
            let mut calls = Vec::new();
            let dot = |g: usize, pass: &[usize], mut soon: Upcoming| {
                calls.push((g, pass.to_vec(), soon.span()));
                (0..4).for_each(|_| soon.step());
                assert!(soon.span().is_empty(), "the steps leave part of it unasked");
                std::array::from_fn(|k| {
                    std::array::from_fn(|r| {
                        (1000 * pass.get(k).map_or(0, |&t| t) + 16 * g + r) as f32
                    })
                })
            };
            lane_groups(&columns, range.clone(), &rows_of, per_pass, (group, 4), dot);
            let case = format!("{n} rows, {per_pass} a pass, chunk {range:?}");
            let passes = n.div_ceil(per_pass);
            let groups = range.start / 16..range.end.div_ceil(16);
            assert_eq!(calls.len(), groups.len() * passes, "{case}");
            for (i, g) in groups.clone().enumerate() {
                let mine = &calls[i * passes..(i + 1) * passes];
                let mut asked = Vec::new();
                for (k, (got_g, pass, span)) in mine.iter().enumerate() {
                    let want = &rows_of[per_pass * k..(per_pass * (k + 1)).min(n)];
                    assert_eq!((*got_g, pass.as_slice()), (g, want), "{case}");
                    assert!(k > 0 || span.is_empty(), "{case}: a first pass asked");
                    if !span.is_empty() {
                        asked.push(span.clone());
                    }
                }
                // Consecutive parts, together the next group's lines.
                match passes > 1 && g + 1 < groups.end {
                    true => {
                        let want = at(g + 1, 0)..at(g + 1, 10);
                        assert_eq!(asked.first().unwrap().start, want.start, "{case}, {g}");
                        assert_eq!(asked.last().unwrap().end, want.end, "{case}, {g}");
                        assert!(asked.windows(2).all(|w| w[0].end == w[1].start));
                    }
                    false => assert!(asked.is_empty(), "{case}, group {g}"),
                }
            }
            for t in 0..n {
                for r in 0..rows {
                    let want = match range.contains(&r) {
                        true => (1000 * t + r) as f32,
                        false => 0.0,
                    };
                    assert_eq!(out[t * rows + r], want, "{case}: row {t}, feature {r}");
                }
            }
        }
    }
}

//! The one trait every weight layout implements ([`Layout`]: multiply a chunk of its
//! rows), and what the interleaved layouts share (their lane groups, and the passes of
//! activation rows over them). Which layout a matrix gets is chosen by its format's row of
//! the kernels' table ([`super::table`]), apart from the trait it chooses among.

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::act_tile::Line;
use super::output::Columns;
use super::{Activations, RowKernel};
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

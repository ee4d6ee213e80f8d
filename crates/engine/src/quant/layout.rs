//! How a matrix with kernels of our own holds its weights: one layout per format and
//! CPU, chosen once at load ([`lay_out`], the only place that choice is made), each
//! behind the one [`Layout`] trait that multiplies a chunk of its rows.
//!
//! The layouts, and the modules that hold them with their kernels:
//! - Q8_0, Q4_1, Q5_0 and Q4_0 (the last with llama.cpp's repacked arithmetic)
//!   interleaved sixteen rows to a vector where the CPU has AVX-512 VNNI: `block_lanes`;
//! - block-of-32 formats (Q4_0 with rows not a multiple of eight, and the others
//!   elsewhere) repacked eight rows at a time: `packed` (portable) and `packed_simd`
//!   (AVX2, AVX-512 VNNI);
//! - Q4_K and Q6_K interleaved sixteen rows to a vector where the CPU has AVX-512 VNNI:
//!   `q4k_lanes`, `q6k_lanes`;
//! - Q5_K and IQ4_XS two rows to a vector there: `pair_lanes`;
//! - every other quantized format, and these on other CPUs, row after row: `rows`
//!   (portable kernels in `kquant`, `dot`, `iq4`; AVX2 ones in `kquant_simd`);
//! - F32, F16 and BF16 row after row: `float_rows` (portable `float`, AVX-512 or AVX2
//!   `float_simd`).
//!
//! However a matrix is laid out, each row's arithmetic is that of its format's portable
//! kernel (the bit-identity tests of each module), so the choice changes speed only.

use std::ops::Range;

use super::block_lanes::BlockLanes;
use super::dot::BlockFormat;
use super::float_rows::FloatRows;
use super::output::Columns;
use super::packed::PackedRows;
use super::pair_lanes::{PairFormat, PairLanes};
use super::q4k_lanes::Q4kLanes;
use super::q6k_lanes::Q6kLanes;
use super::rows::RowMajor;
use super::{kquant, simd_wide_tiles, Activations, OwnFormat, RowKernel};

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
            if simd_wide_tiles() =>
        {
            Box::new(BlockLanes::new(f, data, rows, cols))
        }
        OwnFormat::Blocks(f) => Box::new(PackedRows::new(f, data, rows, cols)),
        OwnFormat::Q4_0Repacked if simd_wide_tiles() => {
            Box::new(BlockLanes::new(BlockFormat::Q4_0, data, rows, cols))
        }
        OwnFormat::Q4K if simd_wide_tiles() => Box::new(Q4kLanes::new(data, rows, blocks)),
        OwnFormat::Q6K if simd_wide_tiles() => Box::new(Q6kLanes::new(data, rows, blocks)),
        OwnFormat::Q5K if simd_wide_tiles() => {
            Box::new(PairLanes::new(PairFormat::Q5K, data, rows, blocks))
        }
        OwnFormat::Iq4Xs if simd_wide_tiles() => {
            Box::new(PairLanes::new(PairFormat::Iq4Xs, data, rows, blocks))
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
pub(super) const LANE_ROWS: usize = super::q4k_lanes::ROWS;

/// Runs `dot(g, four)` (the sixteen weight rows of interleaved group `g` by up to four
/// activation rows `four`, results `[k][lane]`) over the groups that overlap the chunk
/// `range`, for the activation rows `rows`, and writes the chunk's results. A group's
/// calls come one after another, so `dot` may keep what it prepared for the group.
#[cfg(target_arch = "x86_64")]
pub(super) fn lane_groups(
    out: &Columns,
    range: Range<usize>,
    rows: &[usize],
    mut dot: impl FnMut(usize, &[usize]) -> [[f32; LANE_ROWS]; 4],
) {
    for g in range.start / LANE_ROWS..range.end.div_ceil(LANE_ROWS) {
        for four in rows.chunks(4) {
            // The group's first row may come before the chunk's.
            let first = (g * LANE_ROWS).max(range.start);
            for (&t, got) in four.iter().zip(&dot(g, four)) {
                out.set_run(t, first, &got[first - g * LANE_ROWS..]);
            }
        }
    }
}

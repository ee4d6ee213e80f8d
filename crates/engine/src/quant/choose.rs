//! How a matrix with kernels of our own holds its weights: one layout per format and
//! CPU, chosen once at load ([`lay_out`], the only place that choice is made), each
//! behind the one [`Layout`] trait (in [`super::layout`]) that multiplies a chunk of its rows.
//!
//! The layouts, and the modules that hold them with their kernels:
//! - Q8_0, Q4_1, Q5_0, Q4_0, Q5_1 and IQ4_NL (Q4_0 and IQ4_NL with llama.cpp's repacked
//!   arithmetic) interleaved sixteen rows to a vector where the CPU has AVX2 (kernels for
//!   AVX-512 VNNI, and for AVX2 eight rows at a time): `block_lanes`;
//! - block-of-32 formats (Q4_0 with rows not a multiple of eight, and the others
//!   elsewhere) repacked eight rows at a time: `packed` (portable) and its `simd` child
//!   (AVX2, AVX-512 VNNI);
//! - Q4_K and Q6_K interleaved sixteen rows to a vector where the CPU has AVX2 (kernels
//!   for AVX-512 VNNI, and for AVX2 alone eight rows at a time): `q4k_lanes`, `q6k_lanes`;
//! - Q5_K and IQ4_XS two rows to a vector with AVX-512 VNNI (`pair_lanes`); with AVX2
//!   alone they, and Q2_K and Q3_K wherever the CPU has AVX2, sixteen rows to a vector
//!   (`k_lanes`: kernels for AVX-512 VNNI, Q2_K's and Q3_K's, and for AVX2 eight rows at a
//!   time);
//! - every other quantized format, and these on other CPUs, row after row: `rows`
//!   (portable kernels in the formats' files, `formats/`);
//! - F32, F16 and BF16 row after row: `float_rows` (portable `float`, AVX-512 or AVX2
//!   `float_simd`).
//!
//! However a matrix is laid out, each row's arithmetic is that of its format's portable
//! kernel (the bit-identity tests of each module), so the choice changes speed only.

use super::block_lanes::{BlockLanes, LaneFormat};
use super::float_rows::FloatRows;
use super::formats::block_format::BlockFormat;
use super::k_lanes::{KLaneFormat, KLanes};
use super::layout::Layout;
use super::packed::PackedRows;
use super::pair_lanes::{PairFormat, PairLanes};
use super::q4k_lanes::Q4kLanes;
use super::q6k_lanes::Q6kLanes;
use super::rows::RowMajor;
use super::OwnFormat;

/// `rows × cols` weights of `format` (raw blocks, row after row, sizes already checked)
/// laid out for this CPU's kernels, its memory in huge pages where the system allows.
pub(super) fn lay_out(format: OwnFormat, data: &[u8], rows: usize, cols: usize) -> Box<dyn Layout> {
    let laid = choose(format, data, rows, cols);
    laid.back_with_huge_pages();
    laid
}

/// [`lay_out`]'s choice of layout.
fn choose(format: OwnFormat, data: &[u8], rows: usize, cols: usize) -> Box<dyn Layout> {
    let blocks = cols / crate::quant::q8k::QK_K;
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
        OwnFormat::Listed(f) => {
            (f.lay_out.expect("the registry lays out its own formats"))(data, rows, cols)
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

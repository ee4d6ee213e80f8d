//! Q2_K: a super-block of 256 two-bit values in sixteen sub-blocks of 16, each with a
//! 4-bit scale and minimum, and f16 `d` and `dmin` (84 bytes). Its products follow
//! llama.cpp's repacked kernels (x86 with AVX-512, rows a multiple of eight).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::super::q8k::Q8KRow;
use super::super::RowKernel;
use super::kquant::{self, super_block, PairSums, SuperBlock};
use super::{blocks, FormatInfo};
use crate::simd::convert::f16_le;

/// A super-block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q2K {
    /// Sub-block `j`'s scale in the low nibble of byte `j`, its minimum in the high one.
    pub(in crate::quant) scales: [u8; 16],
    /// Value `128h + 32s + e` at bits `2s..2s + 2` of byte `32h + e`.
    qs: [u8; 64],
    /// The scales' scale, an f16.
    d: [u8; 2],
    /// The minimums' scale, an f16.
    dmin: [u8; 2],
}

impl SuperBlock for Q2K {
    const NAME: &'static str = "Q2_K";
    const GGML_TYPE: u32 = 10;
}

/// Bytes per super-block.
pub(in crate::quant) const BYTES: usize = size_of::<Q2K>();

/// The registry's row.
pub(super) const INFO: FormatInfo = kquant::info::<Q2K>(GgmlDType::Q2K);

/// The dot product of a weight row with a Q8_K activation row as llama.cpp computes it
/// once it has repacked the matrix eight rows at a time (x86 with AVX-512, rows a
/// multiple of eight): the integer sums of the scaled values and of the scaled minimums,
/// each folded into its own accumulator with one fused multiply-add, per super-block by
/// the GEMV and per half super-block by the four-row GEMM; the minimums' accumulator is
/// subtracted at the end.
pub(in crate::quant) fn dot_repacked(w: &[u8], a: &Q8KRow, kernel: RowKernel) -> f32 {
    let mut sums = PairSums::new(kernel);
    for (b, block) in blocks::<Q2K>(w).iter().enumerate() {
        let (dd, dm) = (f16_le(block.d) * a.d[b], f16_le(block.dmin) * a.d[b]);
        let (q8, bsums) = super_block(a, b);
        for half in 0..2 {
            let (mut psum, mut pmin) = (0i32, 0i32);
            for shift in 0..4 {
                for part in 0..2 {
                    let j = 8 * half + 2 * shift + part;
                    let scales = block.scales[j];
                    let (sc, m) = ((scales & 0x0F) as i32, (scales >> 4) as i32);
                    let mut dot = 0i32;
                    for e in 16 * part..16 * part + 16 {
                        let q = ((block.qs[32 * half + e] >> (2 * shift)) & 3) as i32;
                        dot += q * q8[128 * half + 32 * shift + e] as i32;
                    }
                    psum += sc * dot;
                    pmin += m * bsums[j];
                }
            }
            sums.pair(psum, pmin, dd, dm);
        }
        sums.end_block(dd, dm);
    }
    sums.result()
}

//! Q4_K: a super-block of 256 four-bit values in eight sub-blocks of 32, each with a 6-bit
//! scale and minimum, and f16 `d` and `dmin` (144 bytes). Its products follow llama.cpp's
//! repacked 8×8 kernels: the GEMV (one row alone: one fused multiply-add per super-block)
//! or the GEMM (a group of four prompt rows: one per pair of sub-blocks, with activations
//! quantized by `quantize_mat_q8_K_4x8`).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::super::q8k::Q8KRow;
use super::super::RowKernel;
use super::kquant::{self, scale_min_k4, super_block, PairSums, SuperBlock};
use super::{blocks, FormatInfo};
use crate::simd::convert::f16_le;

/// A super-block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q4K {
    /// The scales' scale, an f16.
    d: [u8; 2],
    /// The minimums' scale, an f16.
    dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit minimums, packed ([`scale_min_k4`]).
    pub(in crate::quant) scales: [u8; 12],
    /// Sub-blocks `2p` and `2p + 1` in the low and high nibbles of bytes `32p..32p + 32`.
    qs: [u8; 128],
}

impl SuperBlock for Q4K {
    const NAME: &'static str = "Q4_K";
    const GGML_TYPE: u32 = 12;
}

/// Bytes per super-block.
pub(in crate::quant) const BYTES: usize = size_of::<Q4K>();

/// The registry's row.
pub(super) const INFO: FormatInfo = kquant::info::<Q4K>(GgmlDType::Q4K);

/// The dot product of a weight row with a Q8_K activation row, rounded as `kernel`.
pub(in crate::quant) fn dot(w: &[u8], a: &Q8KRow, kernel: RowKernel) -> f32 {
    let mut sums = PairSums::new(kernel);
    for (b, block) in blocks::<Q4K>(w).iter().enumerate() {
        let (q8, bsums) = super_block(a, b);
        let (dd, dm) = (f16_le(block.d) * a.d[b], f16_le(block.dmin) * a.d[b]);
        for pair in 0..4 {
            let (mut psum, mut pmin) = (0i32, 0i32);
            for half in 0..2 {
                let j = pair * 2 + half;
                let (sc, m) = scale_min_k4(j, &block.scales);
                let mut dot = 0i32;
                for l in 0..32 {
                    let byte = block.qs[pair * 32 + l];
                    let q = if half == 0 { byte & 0x0F } else { byte >> 4 } as i32;
                    dot += q * q8[j * 32 + l] as i32;
                }
                psum += sc * dot;
                pmin += m * (bsums[2 * j] + bsums[2 * j + 1]);
            }
            sums.pair(psum, pmin, dd, dm);
        }
        sums.end_block(dd, dm);
    }
    sums.result()
}

/// [`dot`] of one weight row with up to four activation rows, each rounded as its kernel
/// says (entries past the given rows are zero), in portable code: CPUs with AVX2 take the
/// interleaved layout's kernels (`q4k_lanes`) instead.
pub(in crate::quant) fn dot_tile(w: &[u8], a: &[&Q8KRow], kernels: &[RowKernel]) -> [f32; 4] {
    assert_eq!(kernels.len(), a.len());
    kquant::tile(a, |r, a| dot(w, a, kernels[r]))
}

#[cfg(test)]
pub(in crate::quant) mod tests {
    use super::*;
    use crate::quant::q8k::{quantize_row_q8k, QK_K};
    use half::f16;

    /// Dequantizes a Q4_K block the reference way.
    fn dequantized(block: &[u8]) -> Vec<f32> {
        let block: &Q4K = super::super::view(block);
        let (d, dmin) = (f16_le(block.d), f16_le(block.dmin));
        let mut out = vec![0f32; QK_K];
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &block.scales);
            for l in 0..32 {
                let byte = block.qs[(j / 2) * 32 + l];
                let q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                out[j * 32 + l] = d * sc as f32 * q as f32 - dmin * m as f32;
            }
        }
        out
    }

    /// A super-block with small scales and varied bytes.
    pub(in crate::quant) fn sample() -> Vec<u8> {
        let mut block = vec![0u8; BYTES];
        block[0..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(0.02).to_le_bytes());
        for (i, b) in block[4..].iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        block
    }

    #[test]
    fn the_dot_product_matches_the_dequantized_product() {
        let block = sample();
        let x: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 5.0)
            .collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let w = dequantized(&block);
        let exact: f32 = (0..QK_K).map(|i| w[i] * a.d[0] * a.qs[i] as f32).sum();
        for kernel in [RowKernel::Gemv, RowKernel::Gemm4] {
            let got = dot_tile(&block, &[&a], &[kernel])[0];
            assert!(
                (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
                "{kernel:?}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn the_kernels_differ_only_in_rounding() {
        let blocks: Vec<u8> = (0..4).flat_map(|_| sample()).collect();
        let x: Vec<f32> = (0..4 * QK_K)
            .map(|i| ((i * 7919 % 1013) as f32 / 300.0 - 1.7) * 1.37)
            .collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let (gemv, gemm) = (
            dot(&blocks, &a, RowKernel::Gemv),
            dot(&blocks, &a, RowKernel::Gemm4),
        );
        assert!(
            (gemv - gemm).abs() <= 1e-5 * gemv.abs().max(1.0),
            "{gemv} vs {gemm}"
        );
    }
}

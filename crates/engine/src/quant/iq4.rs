//! IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table of 16 values, with one
//! f16 scale per block of 32 (IQ4_NL) or one per super-block of 256 and a 6-bit scale per
//! block of 32 (IQ4_XS). Products follow llama.cpp on x86: IQ4_XS its `vec_dot` (eight
//! integer lanes, one fused multiply-add per super-block, `hsum_float_8`) for rows of
//! micro-batches under 8 and its tiled matmul ([`dot_iq4_xs_tiled`]) for wider ones. IQ4_NL
//! is a format of the table family (`formats/iq4_nl.rs`); its table and block size are here
//! because the lane layouts share them.

use super::kquant::{Q8KRow, QK_K};
use crate::simd::convert::f16_at;
use crate::simd::reduce::hsum8;

/// The sixteen values an index stands for (`kvalues_iq4nl`).
pub const VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// Bytes per IQ4_NL block of 32 values.
pub const IQ4_NL: usize = 18;
/// Bytes per IQ4_XS super-block of 256 values.
pub const IQ4_XS: usize = 136;

/// The 32 table values of 16 bytes of indices: low nibbles first, then high ones.
fn values_of(qs: &[u8]) -> [i32; 32] {
    let mut out = [0i32; 32];
    for (j, &b) in qs.iter().take(16).enumerate() {
        out[j] = VALUES[(b & 0x0F) as usize] as i32;
        out[j + 16] = VALUES[(b >> 4) as usize] as i32;
    }
    out
}

/// The signed scale of block `ib` (0..8) of an IQ4_XS super-block.
pub(super) fn xs_scale(block: &[u8], ib: usize) -> i32 {
    let high = u16::from_le_bytes([block[2], block[3]]);
    let low = (block[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    (low as i32 | ((((high >> (2 * ib)) & 3) as i32) << 4)) - 32
}

/// The dot product of an IQ4_XS weight row with a Q8_K activation row.
pub fn dot_iq4_xs(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in w.chunks_exact(IQ4_XS).enumerate() {
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let mut lanes = [0i32; 8];
        for ib in 0..8 {
            let values = values_of(&block[8 + 16 * ib..8 + 16 * ib + 16]);
            let scale = xs_scale(block, ib);
            let q8 = &q8[32 * ib..32 * ib + 32];
            // Exact integer sums, in an order the compiler vectorises.
            let mut products = [0i32; 32];
            for e in 0..32 {
                products[e] = values[e] * q8[e] as i32;
            }
            for (lane, four) in lanes.iter_mut().zip(products.chunks_exact(4)) {
                *lane += scale * (four[0] + four[1] + four[2] + four[3]);
            }
        }
        let d = f16_at(block, 0) * a.d[b];
        for (l, &lane) in lanes.iter().enumerate() {
            acc[l] = d.mul_add(lane as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

/// The dot product of an IQ4_XS weight row with a Q8_K activation row as llama.cpp's tiled
/// matmul computes it for 8 or more activation rows (see `kquant::dot_q5k_tiled`): per
/// super-block the scaled sub-block sums in exact integers, one rounded product by `d`,
/// added times the activation's scale to a running sum that starts at zero. (Its kernel
/// looks the table up 128 higher and takes 128 times the activations' sums back off, which
/// leaves these exact sums.)
pub fn dot_iq4_xs_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in w.chunks_exact(IQ4_XS).enumerate() {
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let mut s1 = 0i32;
        for ib in 0..8 {
            let values = values_of(&block[8 + 16 * ib..8 + 16 * ib + 16]);
            let raw: i32 = (0..32).map(|e| values[e] * q8[32 * ib + e] as i32).sum();
            s1 = s1.wrapping_add(xs_scale(block, ib).wrapping_mul(raw));
        }
        acc = (s1 as f32 * f16_at(block, 0)).mul_add(a.d[b], acc);
    }
    acc
}

/// IQ4_XS dot products of one weight row with up to four activation rows (entries past
/// the given rows are zero), with the tiled kernel's arithmetic ([`dot_iq4_xs_tiled`]) or
/// the one-row kernel's ([`dot_iq4_xs`]).
pub fn dot_iq4_xs_tile(w: &[u8], a: &[&Q8KRow], tiled: bool) -> [f32; 4] {
    assert!(a.len() <= 4);
    let mut out = [0f32; 4];
    for (r, a) in a.iter().enumerate() {
        out[r] = match tiled {
            true => dot_iq4_xs_tiled(w, a),
            false => dot_iq4_xs(w, a),
        };
    }
    out
}

/// One row of IQ4_XS values as f32, as llama.cpp's `dequantize_row_iq4_xs`: the block's
/// scale `d · (ls − 32)` first, then times the table value.
pub fn dequantize_iq4_xs(row: &[u8], out: &mut Vec<f32>) {
    for block in row.chunks_exact(IQ4_XS) {
        let d = f16_at(block, 0);
        for ib in 0..8 {
            let dl = d * xs_scale(block, ib) as f32;
            let values = values_of(&block[8 + 16 * ib..8 + 16 * ib + 16]);
            out.extend(values.iter().map(|&v| dl * v as f32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kquant::quantize_row_q8k;
    use crate::quant::RowKernel;
    use half::f16;

    #[test]
    fn dots_equal_the_dequantized_products() {
        let mut rng = crate::quant::sample::Xorshift::new(9);
        let x: Vec<f32> = (0..QK_K).map(|_| rng.next_f32() * 2.0).collect();
        let mut xs: Vec<u8> = (0..IQ4_XS).map(|_| rng.next_u64() as u8).collect();
        xs[0..2].copy_from_slice(&f16::from_f32(0.001).to_le_bytes());
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let mut w = Vec::new();
        dequantize_iq4_xs(&xs, &mut w);
        let exact: f32 = (0..QK_K).map(|i| w[i] * a.d[0] * a.qs[i] as f32).sum();
        let got = dot_iq4_xs(&xs, &a);
        assert!(
            (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
            "{got} vs {exact}"
        );
    }

    #[test]
    fn xs_scales_take_four_low_and_two_high_bits() {
        let mut block = vec![0u8; IQ4_XS];
        // Block 3: low nibble from scales_l[1] >> 4, high bits 6..8 of scales_h.
        block[5] = 0xA0;
        block[2..4].copy_from_slice(&(0b10u16 << 6).to_le_bytes());
        assert_eq!(xs_scale(&block, 3), (0xA | (0b10 << 4)) - 32);
        assert_eq!(xs_scale(&block, 2), -32);
    }
}

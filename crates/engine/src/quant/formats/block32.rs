//! The family of formats whose block is 32 small integers with one f16 scale (and, for
//! some, an f16 minimum): Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0. A format of it is its block
//! struct, as the file stores it, and the three things that differ between members
//! ([`Block32`]): the scale, the minimum, and how the 32 values are packed. The family
//! gives any of them dequantization and the dot products with Q8 activations in
//! llama.cpp's two arithmetics (its `vec_dot`, [`dot`]; its repacked GEMV/GEMM, [`dot_repacked`]).
//!
//! Their SIMD layouts (`packed.rs`, `block_lanes.rs`) are generic over the member (each
//! layout's trait says what its kernels need of it), chosen by the formats' rows of the
//! kernels' table (`quant/table.rs`), and checked against these products bit for bit.

use bytemuck::Pod;
use candle_core::quantized::GgmlDType;

use super::super::q8::Q8Row;
use super::{blocks, FormatInfo, MatrixReader};
use crate::simd::reduce::hsum8;

/// A format of the family: its block as stored, and what differs between members.
pub(in crate::quant) trait Block32: Pod + Send + Sync + 'static {
    /// ggml's name.
    const NAME: &'static str;
    /// ggml's type id.
    const GGML_TYPE: u32;
    /// candle's type, which reads its tensors.
    const CANDLE: GgmlDType;
    /// The block's scale `d` (a value is `d · q`, plus the minimum where there is one).
    fn scale(&self) -> f32;
    /// The block's minimum `m`, for the formats that have one.
    fn minimum(&self) -> Option<f32> {
        None
    }
    /// The 32 integer values `q`, in order.
    fn values(&self) -> [i32; 32];
}

/// Bytes per block of `F`.
pub(in crate::quant) const fn block_bytes<F: Block32>() -> usize {
    size_of::<F>()
}

/// One row's values as f32 into `out` (32 per whole block): `d · q`, plus `m` for the
/// formats with a minimum (so a value with none is exactly `d · q`, as ggml's
/// `dequantize_row_q8_0` / `_q4_0` give it).
pub(in crate::quant) fn dequantize_into<F: Block32>(row: &[u8], out: &mut [f32]) {
    for (block, out) in blocks::<F>(row).iter().zip(out.chunks_exact_mut(32)) {
        let d = block.scale();
        let values = block.values();
        match block.minimum() {
            Some(m) => {
                for (o, &q) in out.iter_mut().zip(&values) {
                    *o = q as f32 * d + m;
                }
            }
            None => {
                for (o, &q) in out.iter_mut().zip(&values) {
                    *o = q as f32 * d;
                }
            }
        }
    }
}

/// One row's values as f32, appended ([`dequantize_into`]).
#[cfg(test)]
pub(in crate::quant) fn dequantize<F: Block32>(row: &[u8], out: &mut Vec<f32>) {
    let at = out.len();
    out.resize(at + row.len() / block_bytes::<F>() * 32, 0.0);
    dequantize_into::<F>(row, &mut out[at..]);
}

/// The dot product of a weight row with a Q8 activation row, as llama.cpp's x86
/// `vec_dot` computes it for the family (a matrix it does not repack): per block eight
/// lanes of four products, one fused multiply-add of `d_w · d_a` into each lane; the
/// minimums' `m · s_a` folded into a scalar; then `hsum(lanes) + minimums`.
pub(in crate::quant) fn dot<F: Block32>(w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = [0f32; 8];
    let mut minimums = 0f32;
    for (b, block) in blocks::<F>(w).iter().enumerate() {
        let values = block.values();
        if let Some(m) = block.minimum() {
            minimums = m.mul_add(a.s[b], minimums);
        }
        let dd = block.scale() * a.d[b];
        let q = &a.qs[b * 32..(b + 1) * 32];
        for (lane, acc) in acc.iter_mut().enumerate() {
            let sum: i32 = (lane * 4..lane * 4 + 4)
                .map(|e| values[e] * q[e] as i32)
                .sum();
            *acc = dd.mul_add(sum as f32, *acc);
        }
    }
    hsum8(&acc) + minimums
}

/// The dot product as llama.cpp computes it once it has repacked the matrix eight rows at
/// a time (x86 with AVX2, rows a multiple of eight; Q4_0 is the family's member it
/// repacks): each block's integer sum, converted, is folded into one accumulator with a
/// fused multiply-add by `d_w · d_a`, block after block. Its GEMV and four-row GEMM give
/// the same sums, so the row's kernel does not matter.
pub(in crate::quant) fn dot_repacked<F: Block32>(w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = 0f32;
    for (b, block) in blocks::<F>(w).iter().enumerate() {
        let q = &a.qs[b * 32..(b + 1) * 32];
        let sum: i32 = block
            .values()
            .iter()
            .zip(q)
            .map(|(&v, &q)| v * q as i32)
            .sum();
        acc = (sum as f32).mul_add(block.scale() * a.d[b], acc);
    }
    acc
}

/// The registry's row of a format of the family: candle reads its tensors (and
/// embeddings); `QMatrix::new` then lays its matrices out for kernels of our own.
pub(in crate::quant) const fn info<F: Block32>() -> FormatInfo {
    FormatInfo {
        name: F::NAME,
        ggml_type: F::GGML_TYPE,
        block_values: 32,
        block_bytes: block_bytes::<F>(),
        matrix: MatrixReader::Candle(F::CANDLE),
        dequantize: None,
    }
}

#[cfg(test)]
pub(in crate::quant) mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;
    use crate::quant::sample::Xorshift;

    /// A row of `blocks` random blocks of `F`, with small scales (and minimums).
    pub(in crate::quant) fn random_row<F: Block32>(blocks: usize, rng: &mut Xorshift) -> Vec<u8> {
        let mut row: Vec<u8> = (0..blocks * block_bytes::<F>())
            .map(|_| rng.next_u64() as u8)
            .collect();
        for block in row.chunks_exact_mut(block_bytes::<F>()) {
            for at in [0, 2] {
                let x = half::f16::from_f32(rng.next_f32() * 0.01);
                block[at..at + 2].copy_from_slice(&x.to_le_bytes());
            }
        }
        row
    }

    /// Both products of a random row within a float rounding of the dequantized product.
    pub(in crate::quant) fn dots_match_the_dequantized_product<F: Block32>() {
        let mut rng = Xorshift::new(F::GGML_TYPE as u64 + 7);
        let w = random_row::<F>(6, &mut rng);
        let x: Vec<f32> = (0..6 * 32).map(|_| rng.next_f32() * 4.0 - 2.0).collect();
        let a = quantize_row(&x);
        let mut values = Vec::new();
        dequantize::<F>(&w, &mut values);
        let activations: Vec<f32> = (0..x.len()).map(|i| a.d[i / 32] * a.qs[i] as f32).collect();
        let exact: f64 = values
            .iter()
            .zip(&activations)
            .map(|(&v, &x)| v as f64 * x as f64)
            .sum();
        // The minimum meets the activations' f16 block sums, not their exact sums.
        let tolerance = 1e-4 + if F::NAME.ends_with("_1") { 2e-2 } else { 0.0 };
        assert!(
            (dot::<F>(&w, &a) as f64 - exact).abs() < tolerance,
            "{} vec_dot",
            F::NAME
        );
        if !F::NAME.ends_with("_1") {
            assert!(
                (dot_repacked::<F>(&w, &a) as f64 - exact).abs() < tolerance,
                "{} repacked",
                F::NAME
            );
        }
    }
}

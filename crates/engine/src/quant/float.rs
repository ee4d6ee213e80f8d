//! F32 and F16 weight matrices, multiplied as llama.cpp multiplies them on an x86 CPU with
//! AVX-512 (and without AVX512-FP16). A row multiplied alone goes through ggml's vector dot
//! product: four sixteen-lane accumulators over blocks of 64 values, added pairwise, then
//! summed as `_mm512_reduce_add_ps` sums. A row of a batch of two or more goes through
//! llamafile's tinyBLAS (which takes any matrix with a multiple of four rows): one
//! sixteen-lane chain of fused multiply-adds per output, summed the same way. F16 weights
//! meet activations rounded to F16 either way (llama.cpp converts them to the weights' dot
//! product type first). The loops below are those chains written per lane; the compiler
//! vectorises them, and the order of operations is fixed by the code, so they are their
//! own portable twins.

use half::f16;

use crate::model::attention::reduce_add_16;

/// Lanes of one accumulator (an AVX-512 register of f32).
const LANES: usize = 16;
/// Accumulators of ggml's vector dot product (`GGML_F32_ARR`).
const ACCUMULATORS: usize = 4;

/// Whether llama.cpp's tinyBLAS takes a matrix of `rows × cols` (otherwise it falls back
/// to other kernels, which ferrite does not follow for float weights).
pub fn tinyblas_takes(rows: usize, cols: usize) -> bool {
    rows.is_multiple_of(4) && cols.is_multiple_of(LANES)
}

/// `Σ w[k]·x[k]`, rounded as llama.cpp's batched (`batched`) or lone-row kernel.
pub fn dot_f32(w: &[f32], x: &[f32], batched: bool) -> f32 {
    dot(w, x, batched, |v| v)
}

/// [`dot_f32`] of F16 weights with activations already rounded to F16 (held as f32).
pub fn dot_f16(w: &[f16], x: &[f32], batched: bool) -> f32 {
    dot(w, x, batched, f16::to_f32)
}

fn dot<W: Copy>(w: &[W], x: &[f32], batched: bool, widen: impl Fn(W) -> f32) -> f32 {
    if batched {
        // tinyBLAS: lane l accumulates k ≡ l (mod 16) in order.
        let mut acc = [0f32; LANES];
        for (w, x) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
            for l in 0..LANES {
                acc[l] = widen(w[l]).mul_add(x[l], acc[l]);
            }
        }
        return reduce_add_16(&acc);
    }
    // ggml_vec_dot_f32/f16: accumulator j takes the j-th sixteen of every 64 values.
    let mut acc = [[0f32; LANES]; ACCUMULATORS];
    let whole = w.len() / (LANES * ACCUMULATORS) * (LANES * ACCUMULATORS);
    let blocks = w[..whole]
        .chunks_exact(LANES)
        .zip(x[..whole].chunks_exact(LANES));
    for (i, (w, x)) in blocks.enumerate() {
        let acc = &mut acc[i % ACCUMULATORS];
        for l in 0..LANES {
            acc[l] = widen(w[l]).mul_add(x[l], acc[l]);
        }
    }
    let mut first = [0f32; LANES];
    for l in 0..LANES {
        let (a, b) = (acc[0][l] + acc[2][l], acc[1][l] + acc[3][l]);
        first[l] = a + b;
    }
    // The sum is a double from here (the F16 kernel's; for F32 the leftovers are few and
    // none in the shapes served here).
    let mut sum = reduce_add_16(&first) as f64;
    for (&w, &x) in w[whole..].iter().zip(&x[whole..]) {
        sum += (widen(w) * x) as f64;
    }
    sum as f32
}

/// Activations rounded to F16 and back, as llama.cpp converts them for F16 weights.
pub fn round_to_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f64 dot product.
    fn exact(w: &[f32], x: &[f32]) -> f64 {
        w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum()
    }

    #[test]
    fn both_kernels_sum_in_their_own_order() {
        let w: Vec<f32> = (0..192)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let x: Vec<f32> = (0..192).map(|i| 1.0 / (1.0 + i as f32)).collect();
        // tinyBLAS: one chain per lane.
        let mut lanes = [0f32; 16];
        for k in 0..192 {
            lanes[k % 16] = w[k].mul_add(x[k], lanes[k % 16]);
        }
        assert_eq!(
            dot_f32(&w, &x, true).to_bits(),
            reduce_add_16(&lanes).to_bits()
        );
        // The vector dot product: four accumulators, (0 + 2) + (1 + 3).
        let mut acc = [[0f32; 16]; 4];
        for k in 0..192 {
            acc[(k / 16) % 4][k % 16] = w[k].mul_add(x[k], acc[(k / 16) % 4][k % 16]);
        }
        let first: [f32; 16] =
            std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
        assert_eq!(
            dot_f32(&w, &x, false).to_bits(),
            reduce_add_16(&first).to_bits()
        );
        for batched in [false, true] {
            assert!((dot_f32(&w, &x, batched) as f64 - exact(&w, &x)).abs() < 1e-4);
        }
    }

    #[test]
    fn leftovers_past_whole_blocks_of_64_are_added_one_by_one() {
        let w: Vec<f32> = (0..80).map(|i| (i as f32 - 40.0) / 9.0).collect();
        let x: Vec<f32> = (0..80).map(|i| (i as f32).sin()).collect();
        assert!((dot_f32(&w, &x, false) as f64 - exact(&w, &x)).abs() < 1e-4);
    }

    #[test]
    fn f16_weights_meet_f16_rounded_activations() {
        let w: Vec<f16> = (0..128)
            .map(|i| f16::from_f32(0.01 * i as f32 - 0.3))
            .collect();
        let x: Vec<f32> = (0..128).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let xr = round_to_f16(&x);
        assert!(xr.iter().zip(&x).any(|(a, b)| a != b));
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        for batched in [false, true] {
            assert_eq!(
                dot_f16(&w, &xr, batched).to_bits(),
                dot_f32(&wf, &xr, batched).to_bits()
            );
        }
    }
}

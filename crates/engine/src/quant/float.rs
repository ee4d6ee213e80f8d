//! F32 and F16 weight matrices, multiplied as llama.cpp multiplies them on an x86 CPU with
//! AVX-512 (and without AVX512-FP16). A row multiplied alone goes through ggml's vector dot
//! product: four sixteen-lane accumulators over blocks of 64 values, added pairwise, then
//! summed as `_mm512_reduce_add_ps` sums. A row of a batch of two or more goes through
//! llamafile's tinyBLAS (which takes any matrix with a multiple of four rows): one
//! sixteen-lane chain of fused multiply-adds per output, summed the same way. F16 weights
//! meet activations rounded to F16 either way (llama.cpp converts them to the weights' dot
//! product type first). The loops below are those chains written per lane; the compiler
//! vectorises them, and the order of operations is fixed by the code, so they are their
//! own portable twins. BF16 follows the AVX512-BF16 instructions (see [`dot_bf16`]). All
//! three follow llama.cpp built for this machine's kind of CPU (AVX-512, AVX512-BF16, no
//! AVX512-FP16); on other CPUs llama.cpp sums in other orders, which ferrite does not follow
//! yet.

use half::{bf16, f16};

use crate::simd::reduce::reduce_add_16;

/// Lanes of one accumulator (an AVX-512 register of f32).
const LANES: usize = 16;
/// Accumulators of ggml's vector dot product (`GGML_F32_ARR`).
const ACCUMULATORS: usize = 4;

/// Whether llama.cpp's tinyBLAS takes a matrix of `rows × cols` (otherwise it falls back
/// to other kernels, which ferrite does not follow for float weights); BF16 rows go 32
/// values at a time.
pub fn tinyblas_takes(rows: usize, cols: usize, bf16: bool) -> bool {
    rows.is_multiple_of(4) && cols.is_multiple_of(if bf16 { 2 * BF16_PAIRS } else { LANES })
}

/// `Σ w[k]·x[k]`, rounded as llama.cpp's batched (`batched`) or lone-row kernel.
pub fn dot_f32(w: &[f32], x: &[f32], batched: bool) -> f32 {
    dot(w, x, batched, |v| v)
}

/// [`dot_f32`] of F16 weights with activations rounded to F16. They are held as F16, as
/// llama.cpp holds them: half the bytes of f32 next to the weights streaming through the
/// first-level cache (the lone row of a 1B model's F16 decode ran about 10% faster so).
pub fn dot_f16(w: &[f16], x: &[f16], batched: bool) -> f32 {
    dot(w, x, batched, f16::to_f32)
}

/// [`dot_f32`] of four weight rows with one activation row.
pub fn dot4_f32(ws: [&[f32]; 4], x: &[f32], batched: bool) -> [f32; 4] {
    dot4(ws, x, batched, |v| v)
}

/// [`dot_f16`] of four weight rows with one activation row.
pub fn dot4_f16(ws: [&[f16]; 4], x: &[f16], batched: bool) -> [f32; 4] {
    dot4(ws, x, batched, f16::to_f32)
}

/// Four rows' [`dot`]s. A batched row's one chain per lane waits on each fused
/// multiply-add before the next, so the four rows' chains run interleaved (as tinyBLAS
/// interleaves a tile's cells); each cell's operations and their order are [`dot`]'s.
fn dot4<W: Copy, X: Copy + Into<f32>>(
    ws: [&[W]; 4],
    x: &[X],
    batched: bool,
    widen: impl Fn(W) -> f32,
) -> [f32; 4] {
    if !batched {
        return ws.map(|w| dot(w, x, false, &widen));
    }
    let mut acc = [[0f32; LANES]; 4];
    for (k, x) in x.chunks_exact(LANES).enumerate() {
        for (acc, w) in acc.iter_mut().zip(&ws) {
            let w = &w[k * LANES..(k + 1) * LANES];
            for l in 0..LANES {
                acc[l] = widen(w[l]).mul_add(x[l].into(), acc[l]);
            }
        }
    }
    acc.map(|a| reduce_add_16(&a))
}

/// `Σ w[k]·x[k]` in the order of llama.cpp's batched or lone-row kernel; activations of
/// type `X` are widened exactly (f32 as it is, F16 to f32).
fn dot<W: Copy, X: Copy + Into<f32>>(
    w: &[W],
    x: &[X],
    batched: bool,
    widen: impl Fn(W) -> f32,
) -> f32 {
    if batched {
        // tinyBLAS: lane l accumulates k ≡ l (mod 16) in order.
        let mut acc = [0f32; LANES];
        for (w, x) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
            for l in 0..LANES {
                acc[l] = widen(w[l]).mul_add(x[l].into(), acc[l]);
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
            acc[l] = widen(w[l]).mul_add(x[l].into(), acc[l]);
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
        sum += (widen(w) * x.into()) as f64;
    }
    sum as f32
}

/// Lanes of one `vdpbf16ps` accumulator, and the values one instruction takes.
const BF16_PAIRS: usize = 16;

/// `Σ w[k]·x[k]` of BF16 weights and activations already rounded to BF16 (held as f32),
/// as llama.cpp computes it on a CPU with AVX512-BF16: `vdpbf16ps`, whose lane `j` adds the
/// exact products of values `2j + 1` and then `2j` of every 32, each addition rounded to
/// nearest even with subnormals flushed to zero. A batched row takes one accumulator per
/// output (tinyBLAS); a lone row two, over alternate blocks of 32, each summed as
/// `_mm512_reduce_add_ps` and added in f64 (`ggml_vec_dot_bf16`), with any values past the
/// last whole block of 64 added one by one.
pub fn dot_bf16(w: &[bf16], x: &[f32], batched: bool) -> f32 {
    let block = 2 * BF16_PAIRS;
    let step = |acc: &mut [f32; BF16_PAIRS], w: &[bf16], x: &[f32]| {
        for (j, lane) in acc.iter_mut().enumerate() {
            for k in [2 * j + 1, 2 * j] {
                let product = flush(flush(w[k].to_f32()) * flush(x[k]));
                *lane = flush(*lane + product);
            }
        }
    };
    if batched {
        let mut acc = [0f32; BF16_PAIRS];
        for (w, x) in w.chunks_exact(block).zip(x.chunks_exact(block)) {
            step(&mut acc, w, x);
        }
        return reduce_add_16(&acc);
    }
    let mut acc = [[0f32; BF16_PAIRS]; 2];
    let whole = w.len() / (2 * block) * (2 * block);
    let blocks = w[..whole]
        .chunks_exact(block)
        .zip(x[..whole].chunks_exact(block));
    for (i, (w, x)) in blocks.enumerate() {
        step(&mut acc[i % 2], w, x);
    }
    let mut sum = reduce_add_16(&acc[0]) as f64 + reduce_add_16(&acc[1]) as f64;
    for (&w, &x) in w[whole..].iter().zip(&x[whole..]) {
        sum += (w.to_f32() * x) as f64;
    }
    sum as f32
}

/// A subnormal flushed to zero (keeping its sign), as `vdpbf16ps` treats them.
fn flush(v: f32) -> f32 {
    if v != 0.0 && v.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(v)
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::convert::{round_to_bf16, round_to_f16};

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
    fn bf16_lanes_add_the_odd_product_first() {
        // Lane 0 takes values 1, 0, 33, 32 in that order: 2^27 + 1 rounds back to 2^27, so
        // ((2^27 + 1) − 2^27) + 1 = 1, where the even-first order would give
        // ((1 + 2^27) + 1) − 2^27 = 0.
        let big = (1u32 << 27) as f32;
        let mut x = vec![0f32; 64];
        (x[1], x[0], x[33], x[32]) = (big, 1.0, -big, 1.0);
        let x = round_to_bf16(&x);
        let w = vec![bf16::ONE; 64];
        assert_eq!(dot_bf16(&w, &x, true), 1.0);
        // The lone-row kernel puts the two blocks of 32 in different accumulators, where
        // each 1 is lost beside ±2^27: 2^27 + (−2^27) = 0.
        assert_eq!(dot_bf16(&w, &x, false), 0.0);
    }

    #[test]
    fn bf16_flushes_subnormal_products() {
        let x = round_to_bf16(&[1e-20f32; 32]);
        let w = vec![bf16::from_f32(1e-20); 32];
        assert_eq!(dot_bf16(&w, &x, true), 0.0);
    }

    #[test]
    fn f16_weights_meet_f16_rounded_activations() {
        let w: Vec<f16> = (0..128)
            .map(|i| f16::from_f32(0.01 * i as f32 - 0.3))
            .collect();
        let x: Vec<f32> = (0..128).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let xr = round_to_f16(&x);
        let xf: Vec<f32> = xr.iter().map(|v| v.to_f32()).collect();
        assert!(xf.iter().zip(&x).any(|(a, b)| a != b));
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        for batched in [false, true] {
            assert_eq!(
                dot_f16(&w, &xr, batched).to_bits(),
                dot_f32(&wf, &xf, batched).to_bits()
            );
        }
    }
}

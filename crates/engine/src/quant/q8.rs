//! Quantizing activations to Q8 blocks of 32, as ggml's x86 code does.

use half::f16;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// One row of activations quantized to Q8 blocks of 32.
pub struct Q8Row {
    /// Per block: the scale `d` (as stored, f16, widened back to f32).
    pub d: Vec<f32>,
    /// Per block: `d · Σq` rounded to f16 and widened (Q8_1's `s`).
    pub s: Vec<f32>,
    /// The quantized values, 32 per block.
    pub qs: Vec<i8>,
}

/// Quantizes a row (length a multiple of 32): per block `d = amax/127`, values
/// `round_half_even(x · 127/amax)`, and `s = f16(d · Σq)` for Q8_1 dot products.
pub fn quantize_row(x: &[f32]) -> Q8Row {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2() {
        // SAFETY: AVX2, FMA and F16C are available.
        return unsafe { avx2::quantize_row(x) };
    }
    quantize_row_portable(x)
}

/// [`quantize_row`] in portable code.
pub fn quantize_row_portable(x: &[f32]) -> Q8Row {
    let blocks = x.len() / 32;
    let mut row = Q8Row {
        d: Vec::with_capacity(blocks),
        s: Vec::with_capacity(blocks),
        qs: vec![0; x.len()],
    };
    for (b, block) in x.chunks_exact(32).enumerate() {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in row.qs[b * 32..(b + 1) * 32].iter_mut().zip(block) {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sum += r;
        }
        row.d.push(f16::from_f32(d).to_f32());
        row.s.push(f16::from_f32(d * sum as f32).to_f32());
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizes_to_the_block_maximum_with_ties_to_even() {
        let mut x = vec![0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        let q = quantize_row(&x);
        assert_eq!(q.d, vec![1.0]);
        assert_eq!(&q.qs[..3], &[127, 2, -4]);
        assert_eq!(q.s, vec![125.0]);
    }

    #[test]
    fn simd_quantization_matches_the_portable_one() {
        let mut rng = crate::quant::sample::Xorshift::new(11);
        let mut x: Vec<f32> = (0..32 * 40).map(|_| rng.next_f32() * 5.0).collect();
        x[64..96].fill(0.0); // an all-zero block
        x[100] = 1e-30; // a tiny maximum
        let (fast, portable) = (quantize_row(&x), quantize_row_portable(&x));
        assert_eq!(fast.qs, portable.qs);
        assert_eq!(fast.d, portable.d);
        assert_eq!(fast.s, portable.s);
    }
}

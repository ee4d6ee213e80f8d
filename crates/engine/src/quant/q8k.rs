//! Q8_K, the activations' format for the K-quant family (`formats/kquant.rs`): a row in
//! super-blocks of 256 signed bytes with one f32 scale and the sums of each sixteen,
//! quantized as llama.cpp's two quantizers do (the one-row one for its GEMV, the four-row
//! one for its repacked GEMM).

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::RowKernel;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;

/// One row of activations quantized to Q8_K super-blocks.
pub struct Q8KRow {
    /// Per super-block scale.
    pub d: Vec<f32>,
    /// Quantized values.
    pub qs: Vec<i8>,
    /// Per 16 values: their sum.
    pub bsums: Vec<i32>,
}

impl Q8KRow {
    /// Whether the row holds at least `blocks` super-blocks (values, scales and sums).
    pub fn has_blocks(&self, blocks: usize) -> bool {
        self.d.len() >= blocks && self.qs.len() >= blocks * QK_K && self.bsums.len() >= blocks * 16
    }
}

/// Quantizes a row (length a multiple of 256) as ggml does for `kernel`: the scale comes
/// from the value of largest magnitude, values are rounded half to even. When +m and -m
/// both have the largest magnitude, `quantize_row_q8_K_ref` (GEMV) takes the first one and
/// `quantize_mat_q8_K_4x8` (GEMM) the positive one.
pub fn quantize_row_q8k(x: &[f32], kernel: RowKernel) -> Q8KRow {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2() {
        // SAFETY: AVX2, FMA and F16C are available.
        return unsafe { avx2::quantize_row_q8k(x, kernel) };
    }
    quantize_row_q8k_portable(x, kernel)
}

/// [`quantize_row_q8k`] in portable code.
pub fn quantize_row_q8k_portable(x: &[f32], kernel: RowKernel) -> Q8KRow {
    let blocks = x.len() / QK_K;
    let mut row = Q8KRow {
        d: Vec::with_capacity(blocks),
        qs: vec![0; x.len()],
        bsums: vec![0; blocks * 16],
    };
    for (b, block) in x.chunks_exact(QK_K).enumerate() {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in block {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            row.d.push(0.0);
            continue;
        }
        if kernel.in_group_of_four() && max < 0.0 && block.contains(&amax) {
            max = amax;
        }
        let iscale = -127.0 / max;
        let qs = &mut row.qs[b * QK_K..(b + 1) * QK_K];
        for (q, &v) in qs.iter_mut().zip(block) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (g, sum) in row.bsums[b * 16..(b + 1) * 16].iter_mut().enumerate() {
            *sum = qs[g * 16..(g + 1) * 16].iter().map(|&q| q as i32).sum();
        }
        row.d.push(1.0 / iscale);
    }
    row
}

/// Evaluates `$call` with the constant `$N` set to `$n` (zero to four) and copies its `$N`
/// results into the front of `$out`.
#[cfg(target_arch = "x86_64")]
macro_rules! with_row_count {
    ($n:expr, $out:ident, $N:ident => $call:expr) => {
        match $n {
            0 => {}
            1 => {
                const $N: usize = 1;
                $out[..$N].copy_from_slice(&$call);
            }
            2 => {
                const $N: usize = 2;
                $out[..$N].copy_from_slice(&$call);
            }
            3 => {
                const $N: usize = 3;
                $out[..$N].copy_from_slice(&$call);
            }
            4 => {
                const $N: usize = 4;
                $out[..$N].copy_from_slice(&$call);
            }
            n => unreachable!("{n} rows: at most four at a time"),
        }
    };
}

/// For the lane kernels' tests: `$($dot)::+::<T>($lead.., rows, per_row, soon)` for the
/// one to four activation rows `$a`, each with its entry of `$s` (a lane start or a row
/// kernel), `T` their count; the results as a vector.
#[cfg(all(test, target_arch = "x86_64"))]
macro_rules! by_row_count {
    // A kernel generic over a format too: `$dot::<T, $format>`.
    ($($dot:ident)::+ [$format:ty], ($($lead:expr),+), $soon:expr, $a:expr, $s:expr) => {{
        let (a, s, soon) = ($a, $s, $soon);
        match a.len() {
            1 => $($dot)::+::<1, $format>($($lead),+, [a[0]], [s[0]], soon).to_vec(),
            2 => $($dot)::+::<2, $format>($($lead),+, [a[0], a[1]], [s[0], s[1]], soon).to_vec(),
            3 => $($dot)::+::<3, $format>(
                $($lead),+,
                [a[0], a[1], a[2]],
                [s[0], s[1], s[2]],
                soon,
            )
            .to_vec(),
            _ => $($dot)::+::<4, $format>(
                $($lead),+,
                [a[0], a[1], a[2], a[3]],
                [s[0], s[1], s[2], s[3]],
                soon,
            )
            .to_vec(),
        }
    }};
    ($($dot:ident)::+, ($($lead:expr),+), $soon:expr, $a:expr, $s:expr) => {{
        let (a, s, soon) = ($a, $s, $soon);
        match a.len() {
            1 => $($dot)::+::<1>($($lead),+, [a[0]], [s[0]], soon).to_vec(),
            2 => $($dot)::+::<2>($($lead),+, [a[0], a[1]], [s[0], s[1]], soon).to_vec(),
            3 => $($dot)::+::<3>($($lead),+, [a[0], a[1], a[2]], [s[0], s[1], s[2]], soon)
                .to_vec(),
            _ => $($dot)::+::<4>(
                $($lead),+,
                [a[0], a[1], a[2], a[3]],
                [s[0], s[1], s[2], s[3]],
                soon,
            )
            .to_vec(),
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8k_uses_the_signed_maximum() {
        let mut x = vec![0.5f32; QK_K];
        x[3] = -2.0;
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        // The scale comes from -2.0: iscale = -127 / -2.0 = 63.5.
        assert_eq!(a.qs[3], -127);
        assert_eq!(a.qs[0], 32);
        assert_eq!(a.bsums[0], 32 * 15 - 127);
        assert_eq!(a.d[0], 1.0 / 63.5);
    }

    #[test]
    fn simd_q8k_quantization_matches_the_portable_one() {
        let mut rng = crate::quant::sample::Xorshift::new(13);
        let mut x: Vec<f32> = (0..QK_K * 6).map(|_| rng.next_f32() * 3.0).collect();
        x[QK_K..2 * QK_K].fill(0.0); // an all-zero super-block
        x[2 * QK_K + 5] = -9.0; // ties of magnitude: negative first, then positive
        x[2 * QK_K + 200] = 9.0;
        x[3 * QK_K + 7] = 9.0; // positive first, then negative
        x[3 * QK_K + 8] = -9.0;
        x[4 * QK_K + 255] = -7.0; // the extreme last, alone
        for kernel in [RowKernel::Gemv, RowKernel::Gemm4] {
            let (fast, portable) = (
                quantize_row_q8k(&x, kernel),
                quantize_row_q8k_portable(&x, kernel),
            );
            assert_eq!(fast.qs, portable.qs, "{kernel:?}");
            assert_eq!(fast.bsums, portable.bsums, "{kernel:?}");
            let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast.d), bits(&portable.d), "{kernel:?}");
        }
    }

    /// Against llama.cpp's own two quantizers, called on rows that hit every tie rule
    /// (`fixtures/make_q8k.py`): the one-row one for GEMV, the four-row one for the
    /// repacked GEMM. Both of ours, SIMD and portable.
    #[test]
    fn q8k_quantization_matches_llama_cpps_quantizers() {
        let data: serde_json::Value =
            serde_json::from_str(include_str!("../../../../fixtures/q8k.llamacpp.json")).unwrap();
        for (kernel, name) in [
            (RowKernel::Gemv, "quantize_row_q8_K"),
            (RowKernel::Gemm4, "ggml_quantize_mat_q8_K_4x8"),
        ] {
            for (r, row) in data["rows"].as_array().unwrap().iter().enumerate() {
                let x: Vec<f32> = row
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                let want = data[name][r].as_array().unwrap();
                for got in [
                    quantize_row_q8k(&x, kernel),
                    quantize_row_q8k_portable(&x, kernel),
                ] {
                    for (b, block) in want.iter().enumerate() {
                        let d = block["d"].as_f64().unwrap() as f32;
                        assert_eq!(got.d[b].to_bits(), d.to_bits(), "{name} row {r} block {b}");
                        let qs: Vec<i8> = block["qs"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|q| q.as_i64().unwrap() as i8)
                            .collect();
                        assert_eq!(
                            &got.qs[b * QK_K..(b + 1) * QK_K],
                            &qs[..],
                            "{name} row {r} block {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn q8k_ties_follow_the_kernel() {
        let mut x = vec![0.5f32; QK_K];
        x[3] = -2.0;
        x[9] = 2.0;
        // The GEMV quantizer takes the first extreme (-2.0), the GEMM one the positive.
        assert_eq!(quantize_row_q8k(&x, RowKernel::Gemv).d[0], 1.0 / 63.5);
        let gemm = quantize_row_q8k(&x, RowKernel::Gemm4);
        assert_eq!(gemm.d[0], 1.0 / -63.5);
        assert_eq!((gemm.qs[3], gemm.qs[9]), (127, -127));
    }
}

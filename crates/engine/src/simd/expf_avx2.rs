//! ggml's AVX2 `ggml_v_expf` ([`super::ggml_expf::expf_avx2`]) in vectors of eight lanes
//! and of sixteen, each lane the portable port's bits (a test checks). [`super::lanes`]
//! gives it to the kernels as `Lanes::expf_avx2`.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::ggml_expf::consts::*;

/// A vector of eight copies of the f32 whose bits are `bits`.
///
/// # Safety
/// The CPU must have AVX2: register work only.
#[inline(always)]
unsafe fn bits8(bits: u32) -> __m256 {
    // SAFETY: the caller upholds this function's safety contract.
    unsafe { _mm256_castsi256_ps(_mm256_set1_epi32(bits as i32)) }
}

/// A vector of sixteen copies of the f32 whose bits are `bits`.
///
/// # Safety
/// The CPU must have AVX-512F: register work only.
#[inline(always)]
unsafe fn bits16(bits: u32) -> __m512 {
    // SAFETY: the caller upholds this function's safety contract.
    unsafe { _mm512_castsi512_ps(_mm512_set1_epi32(bits as i32)) }
}

/// [`super::ggml_expf::expf_avx2`] of eight lanes.
///
/// # Safety
/// The CPU must have AVX2 and FMA: register work only.
#[inline(always)]
pub(super) unsafe fn expf8(x: __m256) -> __m256 {
    // SAFETY: the caller upholds this function's safety contract, all that these
    // operations need.
    unsafe {
        let r = bits8(ROUND);
        let z = _mm256_fmadd_ps(x, bits8(LOG2E), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, bits8(LN2_LO), _mm256_fnmadd_ps(n, bits8(LN2_HI), x));
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let k = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let scaled = _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(AVX2_SCALED));
        let u = _mm256_mul_ps(b, b);
        let high = _mm256_fmadd_ps(bits8(C[0]), b, bits8(C[1]));
        let middle = _mm256_fmadd_ps(bits8(C[2]), b, bits8(C[3]));
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(high, u, middle),
            u,
            _mm256_mul_ps(bits8(C[4]), b),
        );
        let fast = _mm256_fmadd_ps(j, k, k);
        if _mm256_movemask_ps(scaled) == 0 {
            return fast;
        }
        let negative = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
        let g = _mm256_and_si256(
            _mm256_castps_si256(negative),
            _mm256_set1_epi32(AVX2_NEGATIVE as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(
            g,
            _mm256_set1_epi32(AVX2_ONE_SCALE as i32),
        ));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let beyond = _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(LIMIT));
        let slow = _mm256_blendv_ps(
            _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
            _mm256_mul_ps(s1, s1),
            beyond,
        );
        _mm256_blendv_ps(fast, slow, scaled)
    }
}

/// [`super::ggml_expf::expf_avx2`] of sixteen lanes.
///
/// # Safety
/// The CPU must have AVX-512F: register work only.
#[inline(always)]
pub(super) unsafe fn expf16(x: __m512) -> __m512 {
    // SAFETY: the caller upholds this function's safety contract, all that these
    // operations need.
    unsafe {
        let r = bits16(ROUND);
        let z = _mm512_fmadd_ps(x, bits16(LOG2E), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, bits16(LN2_LO), _mm512_fnmadd_ps(n, bits16(LN2_HI), x));
        let e = _mm512_slli_epi32::<23>(_mm512_castps_si512(z));
        let k = _mm512_castsi512_ps(_mm512_add_epi32(
            e,
            _mm512_castps_si512(_mm512_set1_ps(1.0)),
        ));
        let abs = _mm512_abs_ps(n);
        let scaled = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs, _mm512_set1_ps(AVX2_SCALED));
        let u = _mm512_mul_ps(b, b);
        let high = _mm512_fmadd_ps(bits16(C[0]), b, bits16(C[1]));
        let middle = _mm512_fmadd_ps(bits16(C[2]), b, bits16(C[3]));
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(high, u, middle),
            u,
            _mm512_mul_ps(bits16(C[4]), b),
        );
        let fast = _mm512_fmadd_ps(j, k, k);
        if scaled == 0 {
            return fast;
        }
        let negative = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let g = _mm512_maskz_mov_epi32(negative, _mm512_set1_epi32(AVX2_NEGATIVE as i32));
        let s1 = _mm512_castsi512_ps(_mm512_add_epi32(
            g,
            _mm512_set1_epi32(AVX2_ONE_SCALE as i32),
        ));
        let s2 = _mm512_castsi512_ps(_mm512_sub_epi32(e, g));
        let beyond = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs, _mm512_set1_ps(LIMIT));
        let slow = _mm512_mask_blend_ps(
            beyond,
            _mm512_mul_ps(_mm512_fmadd_ps(s2, j, s2), s1),
            _mm512_mul_ps(s1, s1),
        );
        _mm512_mask_blend_ps(scaled, fast, slow)
    }
}

#[cfg(test)]
mod tests {
    use super::super::ggml_expf::expf_avx2;
    use super::*;

    /// Both widths against the portable port, bit for bit, over the softmax's range, the
    /// edges where the two-factor scaling starts and ends, and -∞, NaN and overflow.
    #[test]
    fn the_vectors_give_the_portable_bits() {
        let cpu = crate::simd::cpu::detected();
        let (wide, narrow) = (
            !crate::simd::cpu::lacks(cpu.avx512, "AVX-512"),
            !crate::simd::cpu::lacks(cpu.avx2, "AVX2"),
        );
        /// Sixteen values through the AVX-512 version.
        ///
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx2,fma,avx512f")]
        unsafe fn wide16(x: &[f32; 16]) -> [f32; 16] {
            // SAFETY: the caller upholds this function's contract; whole-vector loads and
            // stores of sixteen values.
            unsafe {
                let mut out = [0f32; 16];
                _mm512_storeu_ps(out.as_mut_ptr(), expf16(_mm512_loadu_ps(x.as_ptr())));
                out
            }
        }
        /// Sixteen values through the AVX2 version, eight at a time.
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow16(x: &[f32; 16]) -> [f32; 16] {
            // SAFETY: the caller upholds this function's contract; whole-vector loads and
            // stores of eight values.
            unsafe {
                let mut out = [0f32; 16];
                for h in [0, 8] {
                    let v = expf8(_mm256_loadu_ps(x.as_ptr().add(h)));
                    _mm256_storeu_ps(out.as_mut_ptr().add(h), v);
                }
                out
            }
        }
        let mut rng = crate::quant::sample::Xorshift::new(17);
        for round in 0..20_000 {
            let spread = [1.0f32, 30.0, 90.0, 135.0][round % 4];
            let mut x: [f32; 16] = std::array::from_fn(|_| (rng.next_f32() - 0.5) * 2.0 * spread);
            x[round % 16] = [f32::NEG_INFINITY, -200.0, 95.0, f32::NAN, -87.5, -133.0][round % 6];
            let want = x.map(expf_avx2);
            // SAFETY: each version runs only where the CPU has its features.
            let versions = unsafe {
                [
                    ("AVX-512", wide.then(|| wide16(&x))),
                    ("AVX2", narrow.then(|| narrow16(&x))),
                ]
            };
            for (name, got) in versions {
                let Some(got) = got else { continue };
                for ((x, w), g) in x.iter().zip(want).zip(got) {
                    let same = w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan());
                    assert!(same, "{name} expf({x}): {g} where the port gives {w}");
                }
            }
        }
    }

    /// The port is `exp` within a few units in the last place, down into the subnormals.
    #[test]
    fn the_port_is_close_to_exp() {
        for i in -2100..=2000 {
            let x = i as f32 * 0.0437;
            let (got, want) = (expf_avx2(x), (x as f64).exp());
            let rel = ((got as f64 - want) / want).abs();
            assert!(
                rel < 3e-7 || (want < 1.2e-38 && (got as f64 - want).abs() < 1e-44),
                "{x}: {got} vs {want}"
            );
        }
        assert_eq!(expf_avx2(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf_avx2(0.0), 1.0);
        assert_eq!(expf_avx2(-200.0), 0.0);
        assert_eq!(expf_avx2(100.0), f32::INFINITY);
        assert!(expf_avx2(f32::NAN).is_nan());
    }
}

//! ggml's `expf` (its AVX-512 `ggml_v_expf`, which attention's softmax uses), for one
//! value; `simd::lanes` has the vector versions, checked against it bit for bit.

/// Constants of ggml's AVX-512 `ggml_v_expf`, as f32 bit patterns.
pub mod consts {
    /// 0x1.8p23: adding and subtracting it rounds to an integer.
    pub const ROUND: u32 = 0x4b40_0000;
    /// 0x1.715476p+0: log2(e).
    pub const LOG2E: u32 = 0x3fb8_aa3b;
    /// 0x1.62e4p-1 and 0x1.7f7d1cp-20: ln 2 in two parts.
    pub const LN2_HI: u32 = 0x3f31_7200;
    /// See [`LN2_HI`].
    pub const LN2_LO: u32 = 0x35bf_be8e;
    /// The polynomial's coefficients, highest degree first: 0x1.0e4020p-7,
    /// 0x1.573e2ep-5, 0x1.555e66p-3, 0x1.fffdb6p-2, 0x1.ffffecp-1.
    pub const C: [u32; 5] = [
        0x3c07_2010,
        0x3d2b_9f17,
        0x3e2a_af33,
        0x3eff_fedb,
        0x3f7f_fff6,
    ];
    /// Beyond this magnitude of the exponent the result is 0 or infinity.
    pub const LIMIT: f32 = 192.0;
    /// Beyond this magnitude the AVX2 version scales in two factors.
    pub const AVX2_SCALED: f32 = 126.0;
    /// The AVX2 version's bits taken from a negative exponent's first factor and given
    /// to its second.
    pub const AVX2_NEGATIVE: u32 = 0x8200_0000;
    /// The AVX2 version's first factor before those bits: 2^127.
    pub const AVX2_ONE_SCALE: u32 = 0x7f00_0000;
}

/// ggml's vectorised `expf` (AVX-512 `ggml_v_expf`) for one value: `x = n ln 2 + b` with
/// `n` an integer, a degree-5 polynomial in `b`, scaled by `2^n` with a single rounding
/// (`_mm512_scalef_ps`). Not libm's `expf`: the last bit differs for some inputs.
pub fn expf(x: f32) -> f32 {
    use consts::*;
    let Reduced { n, b, u, upper, .. } = reduce(x);
    if n.abs() > LIMIT {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let j = upper.mul_add(u, f32::from_bits(C[4]).mul_add(b, 1.0));
    scale_by_power_of_two(j, n)
}

/// What both of ggml's versions compute first: `x = n ln 2 + b` with `n` an integer, and
/// the polynomial in `b` up to its last term.
struct Reduced {
    /// `x / ln 2` plus [`consts::ROUND`]: its low bits hold `n`.
    z: f32,
    /// `n`, integral (NaN for a NaN `x`).
    n: f32,
    /// `x - n ln 2`, in two parts.
    b: f32,
    /// `b * b`.
    u: f32,
    /// `(C0 b + C1) u + (C2 b + C3)`: the polynomial is `upper * u + last`, `last` each
    /// version's own.
    upper: f32,
}

/// [`Reduced`] of `x`, with ggml's operations in its order.
fn reduce(x: f32) -> Reduced {
    use consts::*;
    let c = |bits: u32| f32::from_bits(bits);
    let r = c(ROUND);
    let z = x.mul_add(c(LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(c(LN2_LO), (-n).mul_add(c(LN2_HI), x));
    let u = b * b;
    let high = c(C[0]).mul_add(b, c(C[1]));
    let middle = c(C[2]).mul_add(b, c(C[3]));
    Reduced {
        z,
        n,
        b,
        u,
        upper: high.mul_add(u, middle),
    }
}

/// ggml's AVX2 `ggml_v_expf` for one value, which the vision towers' attention takes (the
/// one llama.cpp's softmax runs on an AVX2 CPU): [`expf`]'s reduction and polynomial, but
/// without its constant term (`j`), `2^n` made in the exponent's bits (`k`), and the result
/// `j k + k`; past |n| > 126 two factors keep the subnormal and overflowing results, past
/// 192 it is their square (0 or infinity). Cheaper in vectors than the AVX-512 version,
/// whose `scalef` AVX2 has to emulate in f64.
pub fn expf_avx2(x: f32) -> f32 {
    use consts::*;
    let Reduced { z, n, b, u, upper } = reduce(x);
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let j = upper.mul_add(u, f32::from_bits(C[4]) * b);
    // A NaN takes the first branch, as the vectors' comparisons are false for it.
    if n.is_nan() || n.abs() <= AVX2_SCALED {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { AVX2_NEGATIVE } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(AVX2_ONE_SCALE));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    match n.abs() > LIMIT {
        true => s1 * s1,
        false => s2.mul_add(j, s2) * s1,
    }
}

/// `j × 2^n` rounded once to f32, as `_mm512_scalef_ps` does for an integral `n` within
/// ±192 (exact in f64, then one rounding).
pub fn scale_by_power_of_two(j: f32, n: f32) -> f32 {
    if n.is_nan() || j.is_nan() {
        return f32::NAN;
    }
    (j as f64 * 2f64.powi(n as i32)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_expf_is_close_to_exp() {
        for i in -2000..=200 {
            let x = i as f32 * 0.0437;
            let (got, want) = (expf(x), (x as f64).exp());
            let rel = ((got as f64 - want) / want).abs();
            assert!(
                rel < 3e-7 || (want < 1e-37 && (got as f64 - want).abs() < 1e-44),
                "{x}: {got} vs {want}"
            );
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(100.0), f32::INFINITY);
    }

    /// The portable port against the vector versions (`lanes.rs`): AVX-512's is ggml's
    /// instruction sequence itself, AVX2's emulates its `scalef` in f64.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn ggml_expf_port_matches_the_vector_versions() {
        use super::super::lanes::{Avx2, Avx512, Lanes};
        use std::arch::x86_64::*;
        /// ggml's `expf` of sixteen values with AVX-512.
        ///
        /// # Safety
        ///
        /// The CPU has AVX2, FMA, F16C and AVX-512 F.
        #[target_feature(enable = "avx2,fma,f16c,avx512f")]
        unsafe fn expf512(x: &[f32; 16]) -> [f32; 16] {
            // SAFETY: the caller upholds this function's safety contract, all that
            // these operations need.
            unsafe {
                let mut out = [0f32; 16];
                _mm512_storeu_ps(out.as_mut_ptr(), Avx512::expf(_mm512_loadu_ps(x.as_ptr())));
                out
            }
        }
        /// ggml's `expf` of sixteen values with AVX2, eight at a time.
        ///
        /// # Safety
        ///
        /// The CPU has AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn expf256(x: &[f32; 16]) -> [f32; 16] {
            // SAFETY: the caller upholds this function's safety contract, all that
            // these operations need.
            unsafe {
                let mut out = [0f32; 16];
                for h in [0, 8] {
                    let v = Avx2::expf(_mm256_loadu_ps(x.as_ptr().add(h)));
                    _mm256_storeu_ps(out.as_mut_ptr().add(h), v);
                }
                out
            }
        }
        let cpu = crate::simd::cpu::detected();
        let (wide, narrow) = (
            !crate::simd::cpu::lacks(cpu.avx512, "AVX-512"),
            !crate::simd::cpu::lacks(cpu.avx2, "AVX2"),
        );
        let mut rng = crate::quant::sample::Xorshift::new(11);
        for round in 0..20_000 {
            // Mostly the softmax's range, with the underflow edge and beyond.
            let spread = [1.0f32, 30.0, 110.0, 140.0][round % 4];
            let mut x: [f32; 16] = std::array::from_fn(|_| rng.next_f32() * spread);
            x[round % 16] = [f32::NEG_INFINITY, -200.0, 95.0, f32::NAN][round % 4];
            let want = x.map(expf);
            // SAFETY: each version runs only where the CPU has its features.
            let versions = unsafe {
                [
                    ("AVX-512", wide.then(|| expf512(&x))),
                    ("AVX2", narrow.then(|| expf256(&x))),
                ]
            };
            for (name, got) in versions {
                let Some(got) = got else { continue };
                for ((x, w), g) in x.iter().zip(want).zip(got) {
                    let same = w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan());
                    assert!(same, "{name} expf({x}): {g} against {w}");
                }
            }
        }
    }
}

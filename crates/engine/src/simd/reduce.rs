//! Horizontal sums in the orders llama.cpp's kernels add in: the same lanes added in
//! another order round differently, and the answers must match bit for bit.

/// `hsum_float_8`: (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
pub fn hsum8(acc: &[f32; 8]) -> f32 {
    let r = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// `_mm512_reduce_add_ps`: halves added, then quarters, then pairs, then neighbours.
pub fn reduce_add_16(v: &[f32; 16]) -> f32 {
    let mut h = [0f32; 8];
    for i in 0..8 {
        h[i] = v[i] + v[i + 8];
    }
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}

#[cfg(target_arch = "x86_64")]
/// Sums the eight lanes of a 256-bit vector in `hsum_float_8` order.
///
/// # Safety
/// Register-only: safe to call from code compiled with AVX2; from other code the call
/// is `unsafe`, and the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub fn hsum_m256(acc: std::arch::x86_64::__m256) -> f32 {
    hsum8(&f32_lanes(acc))
}

#[cfg(target_arch = "x86_64")]
/// The eight lanes of a 256-bit vector.
///
/// # Safety
/// Register-only: safe to call from code compiled with AVX2; from other code the call
/// is `unsafe`, and the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub fn f32_lanes(v: std::arch::x86_64::__m256) -> [f32; 8] {
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds the eight values stored.
    unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    lanes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The orders are the ones named: values whose sum depends on the order tell them
    /// apart.
    #[test]
    fn sums_add_in_their_named_order() {
        let big = 1.0e8f32;
        let mut eight = [1.0f32; 8];
        eight[0] = big;
        eight[4] = -big;
        // l0+l4 is exact (0); the ones then add up to 6.
        assert_eq!(hsum8(&eight), 6.0);
        let mut sixteen = [1.0f32; 16];
        sixteen[0] = big;
        sixteen[8] = -big;
        assert_eq!(reduce_add_16(&sixteen), 14.0);
        // Left to right, the big value would swallow the ones after it.
        let serial: f32 = sixteen.iter().sum();
        assert_ne!(serial, 14.0);
    }
}

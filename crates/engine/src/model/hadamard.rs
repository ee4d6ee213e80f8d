//! The Walsh–Hadamard rotation llama.cpp applies around attention when its KV cache is
//! quantized: an orthonormal rotation spreads a head's outliers over its dimensions, so
//! that its blocks quantize with less error. With quantized keys the queries and keys are
//! rotated (they meet in a dot product, which the rotation leaves unchanged); with
//! quantized values the values are, and the attention's output is rotated back (the
//! rotation is its own inverse). llama.cpp (b11312 on) does this unless its environment
//! sets `LLAMA_ATTN_ROT_DISABLE`; ferrite always does, to give its numbers.

use crate::kv_cache::KvTypes;

/// Which rows are rotated, in chunks of how many values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rotation {
    /// Chunk size for queries and keys, when keys are quantized: the largest power of two
    /// that divides the head size.
    pub keys: Option<usize>,
    /// Chunk size for values and the attention's output (always 64), when values are
    /// quantized.
    pub values: Option<usize>,
}

impl Rotation {
    /// llama.cpp's rotation for a cache of `types` over heads of `head_dim` values: only
    /// for a quantized type, and only when the head size is a multiple of 64.
    pub fn for_cache(types: KvTypes, head_dim: usize) -> Self {
        let applies = |quantized: bool| quantized && head_dim.is_multiple_of(64);
        Self {
            keys: applies(types.keys.is_quantized()).then(|| 1 << head_dim.trailing_zeros()),
            values: applies(types.values.is_quantized()).then_some(64),
        }
    }
}

/// Rotates each chunk of `n` values of `x` (`n` a power of two dividing `x.len()`) as
/// ggml's fast Walsh–Hadamard transform does: every value times `1/sqrt(n)` first, then
/// the butterflies `(u, v) → (u + v, u − v)` over spans of 1, 2, 4, … `n/2`.
pub fn rotate(x: &mut [f32], n: usize) {
    assert!(n.is_power_of_two() && x.len().is_multiple_of(n));
    let scale = 1.0 / (n as f32).sqrt();
    for chunk in x.chunks_exact_mut(n) {
        for v in chunk.iter_mut() {
            *v *= scale;
        }
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                for j in i..i + len {
                    let (u, v) = (chunk[j], chunk[j + len]);
                    chunk[j] = u + v;
                    chunk[j + len] = u - v;
                }
            }
            len *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::KvType;

    #[test]
    fn rotates_only_quantized_parts_of_heads_of_a_multiple_of_64() {
        let types = |keys, values| KvTypes { keys, values };
        let q8 = types(KvType::Q8_0, KvType::Q8_0);
        assert_eq!(
            Rotation::for_cache(q8, 256),
            Rotation {
                keys: Some(256),
                values: Some(64)
            }
        );
        assert_eq!(Rotation::for_cache(q8, 192).keys, Some(64));
        assert_eq!(Rotation::for_cache(q8, 96), Rotation::default());
        assert_eq!(Rotation::for_cache(KvTypes::F16, 128), Rotation::default());
        let keys_only = Rotation::for_cache(types(KvType::Q4_0, KvType::F16), 128);
        assert_eq!((keys_only.keys, keys_only.values), (Some(128), None));
    }

    /// The transform of a unit vector is a row of the Sylvester matrix over `sqrt(n)`, and
    /// rotating twice gives the input back within rounding.
    #[test]
    fn is_the_sylvester_hadamard_and_its_own_inverse() {
        let mut e = vec![0f32; 8];
        e[3] = 1.0;
        rotate(&mut e, 8);
        let s = 1.0 / 8f32.sqrt();
        // Row 3 of H8: (-1)^popcount(3 & j).
        let expected: Vec<f32> = (0..8)
            .map(|j: u32| {
                if (3 & j).count_ones().is_multiple_of(2) {
                    s
                } else {
                    -s
                }
            })
            .collect();
        assert_eq!(e, expected);
        let x: Vec<f32> = (0..128).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let mut y = x.clone();
        rotate(&mut y, 64);
        assert_ne!(x, y);
        rotate(&mut y, 64);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}

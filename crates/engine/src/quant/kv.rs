//! How the KV cache stores a key or value row: f16 (the default), or llama.cpp's Q8_0 and
//! Q4_0 blocks (its `--cache-type-k` / `--cache-type-v`), written and read with the
//! arithmetic of llama.cpp's CPU backend, so that a quantized cache gives its numbers:
//!
//! - a new row is quantized by the quantizer the backend stores rows with (Q8_0 as its x86
//!   activation quantizer, Q4_0 as its reference one; the formats' files);
//! - a query meets quantized keys as a Q8_0 row, and each dot product is the formats'
//!   `vec_dot` ([`KvType::key_dot`]: eight lanes of four integer products per block, one
//!   fused multiply-add of the two scales' product per lane, then `hsum_float_8`);
//! - a quantized value is read back exactly (`q · d` needs no rounding in f32).
//!
//! The SIMD twins of the key dots and the value sums are in `kv/simd.rs`.

use half::f16;

use super::formats::block32::{self, block_bytes};
use super::formats::{q4_0, q8_0};
use super::q8::{self, Q8Row};
use crate::simd::softmax::{KeySteps, STEP_KEYS};

#[cfg(target_arch = "x86_64")]
mod simd;

/// The type of a KV cache's keys or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvType {
    /// Half precision, as llama.cpp stores them by default.
    #[default]
    F16,
    /// 32 signed bytes with an f16 scale (34 bytes per 32 values).
    Q8_0,
    /// 32 four-bit values offset by 8 with an f16 scale (18 bytes per 32 values).
    Q4_0,
}

impl KvType {
    /// Every type, in the order the flags list them.
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Q8_0, KvType::Q4_0];

    /// llama.cpp's name for it (`f16`, `q8_0`, `q4_0`), which the flags take.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The type named `name` (llama.cpp's names, any case).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether rows are stored in blocks of 32 quantized values.
    pub fn is_quantized(self) -> bool {
        self != KvType::F16
    }

    /// Bytes of a row of `values` values (a multiple of 32 for the quantized types).
    pub fn row_bytes(self, values: usize) -> usize {
        match self {
            KvType::F16 => 2 * values,
            KvType::Q8_0 => values / 32 * block_bytes::<q8_0::Q8_0>(),
            KvType::Q4_0 => values / 32 * block_bytes::<q4_0::Q4_0>(),
        }
    }

    /// Whether heads of `head_dim` values can be stored in this type (llama.cpp refuses a
    /// quantized cache whose head size is not a multiple of its block, 32).
    pub fn fits(self, head_dim: usize) -> bool {
        !self.is_quantized() || head_dim.is_multiple_of(32)
    }

    /// Stores the row `x` in `out` ([`Self::row_bytes`] of `x.len()` bytes).
    pub fn write_row(self, x: &[f32], out: &mut [u8]) {
        assert_eq!(out.len(), self.row_bytes(x.len()));
        match self {
            KvType::F16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                }
            }
            KvType::Q8_0 => q8_0::quantize_into(x, out),
            KvType::Q4_0 => q4_0::quantize_into(x, out),
        }
    }

    /// The values of a stored row, exactly as stored, into `out`.
    pub fn read_row(self, bytes: &[u8], out: &mut [f32]) {
        assert_eq!(bytes.len(), self.row_bytes(out.len()));
        match self {
            KvType::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            KvType::Q8_0 => block32::dequantize_into::<q8_0::Q8_0>(bytes, out),
            KvType::Q4_0 => block32::dequantize_into::<q4_0::Q4_0>(bytes, out),
        }
    }

    /// The dot product of a stored key row (a quantized type's) with a query quantized by
    /// [`KvQuery::new`], as llama.cpp's `vec_dot_q8_0_q8_0` / `vec_dot_q4_0_q8_0` give it.
    pub fn key_dot(self, key: &[u8], query: &KvQuery) -> f32 {
        match self {
            KvType::F16 => panic!("f16 keys meet an f16 query"),
            KvType::Q8_0 => block32::dot::<q8_0::Q8_0>(key, &query.0),
            KvType::Q4_0 => block32::dot::<q4_0::Q4_0>(key, &query.0),
        }
    }
}

impl KvType {
    /// The dot products of a quantized query with `out.len()` stored key heads: head `i` is
    /// `keys[i · stride..]`, [`Self::row_bytes`] of the query's length. As
    /// [`Self::key_dot`] for each, with AVX2 where the CPU has it (same bits).
    pub fn key_dots(self, keys: &[u8], stride: usize, query: &KvQuery, out: &mut [f32]) {
        let head = self.row_bytes(query.values().len());
        assert!(out.is_empty() || keys.len() >= (out.len() - 1) * stride + head);
        #[cfg(target_arch = "x86_64")]
        if self.is_quantized() && crate::simd::avx2() {
            // SAFETY: AVX2, FMA and F16C are available, the type is quantized, and every
            // head lies within `keys` (asserted above).
            return unsafe { simd::key_dots(self, keys, stride, query, out) };
        }
        self.key_dots_portable(keys, stride, query, out);
    }

    /// [`Self::key_dots`] in portable code.
    pub fn key_dots_portable(self, keys: &[u8], stride: usize, query: &KvQuery, out: &mut [f32]) {
        let head = self.row_bytes(query.values().len());
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.key_dot(&keys[i * stride..i * stride + head], query);
        }
    }

    /// Adds `keys` stored value heads (head `i` at `values[i · stride..]`) into the
    /// accumulators of the query rows that attend to them, as llama.cpp's flash attention
    /// does for each row: `acc` holds the rows' accumulators one after another (`head`
    /// values each, `head` = `acc.len()` / rows), `steps` each row's online-softmax steps
    /// for the keys. Key by key, a row's accumulator is rescaled `acc · r` where the key
    /// raised the maximum, then takes `fma(v, w, acc)`: in f32 for a quantized type, the
    /// value read exactly; for f16 values in an f16 accumulator (`acc` holds f16 values,
    /// each step rounded to f16). With AVX2 where the CPU has it (same bits): each value
    /// converted once for every row, four rows' accumulators held in registers across the keys.
    pub fn add_values(
        self,
        values: &[u8],
        stride: usize,
        keys: usize,
        steps: &[KeySteps],
        acc: &mut [f32],
    ) {
        let rows = steps.len();
        assert!(rows > 0 && keys <= STEP_KEYS && acc.len().is_multiple_of(rows));
        let head = acc.len() / rows;
        let head_bytes = self.row_bytes(head);
        assert!(keys == 0 || values.len() >= (keys - 1) * stride + head_bytes);
        #[cfg(target_arch = "x86_64")]
        if head.is_multiple_of(32) && head <= simd::MAX_VALUE_HEAD && crate::simd::avx2() {
            // SAFETY: AVX2, FMA and F16C are available, a head is whole blocks of 32 and
            // fits the kernel's buffer, and every head lies within `values` (asserted
            // above).
            return unsafe { simd::add_values(self, values, stride, keys, steps, acc) };
        }
        self.add_values_portable(values, stride, keys, steps, acc);
    }

    /// [`Self::add_values`] in portable code.
    pub fn add_values_portable(
        self,
        values: &[u8],
        stride: usize,
        keys: usize,
        steps: &[KeySteps],
        acc: &mut [f32],
    ) {
        let head = acc.len() / steps.len().max(1);
        let head_bytes = self.row_bytes(head);
        let mut v = vec![0f32; head];
        let f16_acc = self == KvType::F16;
        let round = |x: f32| {
            if f16_acc {
                f16::from_f32(x).to_f32()
            } else {
                x
            }
        };
        for i in 0..keys {
            self.read_row(&values[i * stride..i * stride + head_bytes], &mut v);
            for (acc, steps) in acc.chunks_exact_mut(head).zip(steps) {
                if steps.raised(i) {
                    for a in acc.iter_mut() {
                        *a = round(*a * steps.rescale[i]);
                    }
                }
                for (a, v) in acc.iter_mut().zip(&v) {
                    *a = round(v.mul_add(steps.weight[i], *a));
                }
            }
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A query head quantized to Q8_0 (as llama.cpp's flash attention quantizes it for
/// quantized keys).
pub struct KvQuery(Q8Row);

impl KvQuery {
    /// `x` (a multiple of 32 values) quantized.
    pub fn new(x: &[f32]) -> Self {
        Self(q8::quantize_row(x))
    }

    /// Per block: the scale, as stored (an f16 widened).
    pub(in crate::quant) fn scales(&self) -> &[f32] {
        &self.0.d
    }

    /// The quantized values.
    pub(in crate::quant) fn values(&self) -> &[i8] {
        &self.0.qs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::sample::Xorshift;

    /// `n` rows of `width` random values stored in `t`, `pad` bytes between rows.
    fn stored(t: KvType, n: usize, width: usize, pad: usize, rng: &mut Xorshift) -> Vec<u8> {
        let stride = t.row_bytes(width) + pad;
        let mut out = vec![0xA5u8; n * stride];
        for i in 0..n {
            let x: Vec<f32> = (0..width).map(|_| rng.next_f32() * 4.0 - 2.0).collect();
            t.write_row(&x, &mut out[i * stride..i * stride + t.row_bytes(width)]);
        }
        out
    }

    /// The dispatched (SIMD where the CPU has it) key dots and value sums give the
    /// portable code's bits, for every type, head size, number of keys (eight at a time
    /// and the rest) and of rows (four at a time and the rest), with a padded stride.
    #[test]
    fn runs_match_the_portable_code_bit_for_bit() {
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let mut rng = Xorshift::new(9);
        for t in KvType::ALL {
            for (width, n) in [(32, 5), (64, 64), (96, 37), (128, 17), (256, 64)] {
                let pad = t.row_bytes(64);
                let stride = t.row_bytes(width) + pad;
                let rows = stored(t, n, width, pad, &mut rng);
                if t.is_quantized() {
                    let q: Vec<f32> = (0..width).map(|_| rng.next_f32() - 0.5).collect();
                    let query = KvQuery::new(&q);
                    let (mut fast, mut slow) = (vec![0f32; n], vec![0f32; n]);
                    t.key_dots(&rows, stride, &query, &mut fast);
                    t.key_dots_portable(&rows, stride, &query, &mut slow);
                    assert_eq!(bits(&fast), bits(&slow), "{t} {width}");
                }
                for query_rows in [1, 2, 3, 4, 5, 8] {
                    // Each query row raises its maximum at its own keys.
                    let steps: Vec<KeySteps> = (0..query_rows)
                        .map(|r| {
                            let mut steps = KeySteps::EMPTY;
                            for i in 0..n {
                                if i % (5 + r) == 0 {
                                    steps.raised |= 1 << i;
                                    steps.rescale[i] = rng.next_f32();
                                }
                                steps.weight[i] = rng.next_f32();
                            }
                            steps
                        })
                        .collect();
                    let mut fast: Vec<f32> =
                        (0..query_rows * width).map(|_| rng.next_f32()).collect();
                    let mut slow = fast.clone();
                    t.add_values(&rows, stride, n, &steps, &mut fast);
                    t.add_values_portable(&rows, stride, n, &steps, &mut slow);
                    assert_eq!(bits(&fast), bits(&slow), "{t} {width} {query_rows} rows");
                }
            }
        }
    }

    #[test]
    fn names_round_trip_and_sizes_follow_the_blocks() {
        for t in KvType::ALL {
            assert_eq!(KvType::parse(t.name()), Some(t));
        }
        assert_eq!(KvType::parse("Q8_0"), Some(KvType::Q8_0));
        assert_eq!(KvType::parse("q5_1"), None);
        assert_eq!(
            [KvType::F16, KvType::Q8_0, KvType::Q4_0].map(|t| t.row_bytes(512)),
            [1024, 544, 288]
        );
        assert!(KvType::Q4_0.fits(96) && !KvType::Q8_0.fits(80) && KvType::F16.fits(80));
    }

    /// Each type reads back what it wrote within its step, f16 and the blocks' values
    /// exactly as stored.
    #[test]
    fn rows_read_back_within_their_step() {
        let mut rng = Xorshift::new(3);
        // Values in -3..3: f16's half step there is 2^-10; Q8_0's is amax/254, plus the
        // scale's f16 rounding; Q4_0's one step, amax/8, where the clamp takes +amax to 7.
        let x: Vec<f32> = (0..128).map(|_| rng.next_f32() * 3.0).collect();
        for (t, step) in [
            (KvType::F16, 1e-3),
            (KvType::Q8_0, 0.015),
            (KvType::Q4_0, 0.38),
        ] {
            let mut bytes = vec![0u8; t.row_bytes(x.len())];
            t.write_row(&x, &mut bytes);
            let mut back = vec![0f32; x.len()];
            t.read_row(&bytes, &mut back);
            let worst = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= step, "{t}: {worst}");
        }
    }

    /// A key dot is the dequantized key times the dequantized query, up to the float sum.
    #[test]
    fn key_dots_match_the_dequantized_product() {
        let mut rng = Xorshift::new(5);
        let k: Vec<f32> = (0..128).map(|_| rng.next_f32() * 2.0 - 1.0).collect();
        let q: Vec<f32> = (0..128).map(|_| rng.next_f32() * 2.0 - 1.0).collect();
        let query = KvQuery::new(&q);
        let qd: Vec<f32> = (0..128)
            .map(|i| query.scales()[i / 32] * query.values()[i] as f32)
            .collect();
        for t in [KvType::Q8_0, KvType::Q4_0] {
            let mut bytes = vec![0u8; t.row_bytes(128)];
            t.write_row(&k, &mut bytes);
            let mut kd = vec![0f32; 128];
            t.read_row(&bytes, &mut kd);
            let exact: f64 = kd.iter().zip(&qd).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert!(
                (t.key_dot(&bytes, &query) as f64 - exact).abs() < 1e-4,
                "{t}"
            );
        }
    }
}

//! AVX2 versions of the block-of-32 dot products. Integer lane sums are exact, and the
//! floating-point steps (one fused multiply-add per lane per block, then `hsum8`) are the
//! same as in the portable code, so both give bit-identical results.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::dot::{hsum8, BlockFormat};
use super::q8::Q8Row;

/// Whether this CPU can run the AVX2 kernels.
pub fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Low nibbles of 16 bytes, then their high nibbles: 32 values 0..=15.
#[target_feature(enable = "avx2")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte i where bit i of `bits` is set, else 0.
#[target_feature(enable = "avx2")]
unsafe fn bit_bytes(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

/// Eight lanes of four products each, for unsigned `x` (≤ 128) and signed `y`.
#[target_feature(enable = "avx2")]
unsafe fn lanes_unsigned(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// An f16 (little-endian bytes at `p`) as f32, with the F16C instruction.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sums the eight lanes in `hsum_float_8` order.
#[target_feature(enable = "avx2")]
unsafe fn hsum(acc: __m256) -> f32 {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    hsum8(&lanes)
}

/// Whether this CPU also has AVX-512 VNNI (with VL): one instruction for the four-product
/// integer lanes that AVX2 computes in two.
pub fn vnni_available() -> bool {
    available() && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
}

/// The dot product of a weight row with a quantized activation row.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]); `w` holds whole blocks and
/// `a` at least as many.
pub unsafe fn dot(format: BlockFormat, w: &[u8], a: &Q8Row) -> f32 {
    tile::<1, 1>(format, [w], [a])[0][0]
}

/// Dot products of `M` weight rows with `N` activation rows (`out[i][r]` = weight row `i`
/// · activation row `r`), with VNNI where the CPU has it. Each weight block is decoded once
/// for the `N` rows and each activation block loaded once for the `M` rows; every pair
/// accumulates exactly as [`dot`] would.
///
/// # Safety
/// As for [`dot`], for every pair; all weight rows have the same length.
pub unsafe fn tile<const M: usize, const N: usize>(
    format: BlockFormat,
    w: [&[u8]; M],
    a: [&Q8Row; N],
) -> [[f32; N]; M] {
    let blocks = w[0].len() / format.block_bytes();
    for row in &w {
        assert_eq!(row.len(), w[0].len());
    }
    for row in &a {
        assert!(row.d.len() >= blocks && row.s.len() >= blocks && row.qs.len() >= blocks * 32);
    }
    if vnni_available() {
        tile_vnni(format, w, a)
    } else {
        tile_avx2(format, w, a)
    }
}

/// [`tile`] for up to four weight rows and four activation rows, or one or two weight rows
/// and eight activation rows, given as slices; entries of the result past the given rows
/// are zero.
///
/// # Safety
/// As for [`tile`].
pub unsafe fn tile_dyn(format: BlockFormat, w: &[&[u8]], a: &[&Q8Row]) -> [[f32; 8]; 4] {
    macro_rules! dispatch {
        ($(($m:literal, $n:literal)),*) => {
            match (w.len(), a.len()) {
                $(($m, $n) => {
                    let got = tile::<$m, $n>(
                        format,
                        std::array::from_fn(|i| w[i]),
                        std::array::from_fn(|r| a[r]),
                    );
                    let mut out = [[0f32; 8]; 4];
                    for i in 0..$m {
                        out[i][..$n].copy_from_slice(&got[i]);
                    }
                    out
                })*
                _ => panic!("tile of {}x{} rows", w.len(), a.len()),
            }
        };
    }
    dispatch!(
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (3, 1),
        (3, 2),
        (3, 3),
        (3, 4),
        (4, 1),
        (4, 2),
        (4, 3),
        (4, 4),
        (1, 8),
        (2, 8)
    )
}

/// [`super::q8::quantize_row`] eight values at a time: the same block maximum, scale and
/// rounding (half to even), so the same bytes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_row(x: &[f32]) -> Q8Row {
    let blocks = x.len() / 32;
    let mut row = Q8Row {
        d: Vec::with_capacity(blocks),
        s: Vec::with_capacity(blocks),
        qs: vec![0; blocks * 32],
    };
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..blocks {
        let p = x.as_ptr().add(b * 32);
        let v = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(p.add(i)));
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for v in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let q = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(v, id))));
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let mut sums = [0i32; 8];
        _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, sum);
        // Pack to bytes; the packs interleave 128-bit halves, the permutation undoes it.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(row.qs.as_mut_ptr().add(b * 32) as *mut __m256i, packed);
        row.d.push(half::f16::from_f32(d).to_f32());
        row.s
            .push(half::f16::from_f32(d * sums.iter().sum::<i32>() as f32).to_f32());
    }
    row
}

/// The four-product integer lanes of unsigned `x` (≤ 128) and signed `y`, with AVX2.
#[target_feature(enable = "avx2")]
unsafe fn lanes_avx2(x: __m256i, y: __m256i) -> __m256i {
    lanes_unsigned(x, y)
}

/// The same lanes with AVX-512 VNNI (exact: no pair of products saturates 16 bits here).
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
unsafe fn lanes_vnni(x: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
}

/// One weight block, decoded: its values as unsigned bytes (the absolute values for a
/// signed format, whose signs then go onto the activations), the raw signed values, the
/// scale, and Q4_1's minimum.
struct Decoded {
    unsigned: __m256i,
    signed: Option<__m256i>,
    d: f32,
    m: f32,
}

// Always inlined (into kernels that enable AVX2 and F16C), so that the format's branch
// and the returned registers fold into the caller's loop.
#[inline(always)]
unsafe fn decode(format: BlockFormat, block: *const u8) -> Decoded {
    let d = f16_at(block);
    let signed = |x: __m256i| Decoded {
        unsigned: _mm256_sign_epi8(x, x),
        signed: Some(x),
        d,
        m: 0.0,
    };
    match format {
        BlockFormat::Q4_0 => signed(_mm256_sub_epi8(nibbles(block.add(2)), _mm256_set1_epi8(8))),
        BlockFormat::Q4_1 => Decoded {
            unsigned: nibbles(block.add(4)),
            signed: None,
            d,
            m: f16_at(block.add(2)),
        },
        BlockFormat::Q5_0 => {
            let qh =
                u32::from_le_bytes([*block.add(2), *block.add(3), *block.add(4), *block.add(5)]);
            let high = _mm256_andnot_si256(bit_bytes(qh), _mm256_set1_epi8(0xF0u8 as i8));
            signed(_mm256_or_si256(nibbles(block.add(6)), high))
        }
        BlockFormat::Q8_0 => signed(_mm256_loadu_si256(block.add(2) as *const __m256i)),
    }
}

/// The tile kernel's body, instantiated once per instruction set so that the lane
/// function inlines.
macro_rules! tile_kernel {
    ($name:ident, $features:literal, $lanes:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const M: usize, const N: usize>(
            format: BlockFormat,
            w: [&[u8]; M],
            a: [&Q8Row; N],
        ) -> [[f32; N]; M] {
            let bytes = format.block_bytes();
            let blocks = w[0].len() / bytes;
            let wp = w.map(|row| row.as_ptr());
            let qs = a.map(|row| row.qs.as_ptr());
            let ds = a.map(|row| row.d.as_ptr());
            let ss = a.map(|row| row.s.as_ptr());
            let mut acc = [[_mm256_setzero_ps(); N]; M];
            let mut extra = [[0f32; N]; M];
            for b in 0..blocks {
                let x: [Decoded; M] = std::array::from_fn(|i| decode(format, wp[i].add(b * bytes)));
                for r in 0..N {
                    let y = _mm256_loadu_si256(qs[r].add(b * 32) as *const __m256i);
                    let da = *ds[r].add(b);
                    for i in 0..M {
                        let y = match x[i].signed {
                            Some(sx) => _mm256_sign_epi8(y, sx),
                            None => y,
                        };
                        let lanes = $lanes(x[i].unsigned, y);
                        let dd = _mm256_set1_ps(x[i].d * da);
                        acc[i][r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), acc[i][r]);
                        if format == BlockFormat::Q4_1 {
                            extra[i][r] = x[i].m.mul_add(*ss[r].add(b), extra[i][r]);
                        }
                    }
                }
            }
            let mut out = [[0f32; N]; M];
            for i in 0..M {
                for r in 0..N {
                    out[i][r] = hsum(acc[i][r]) + extra[i][r];
                }
            }
            out
        }
    };
}

tile_kernel!(tile_avx2, "avx2,fma,f16c", lanes_avx2);
tile_kernel!(tile_vnni, "avx2,fma,f16c,avx512vnni,avx512vl", lanes_vnni);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::OwnFormat;

    const FORMATS: [BlockFormat; 4] = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q8_0,
    ];

    /// Every tile shape and both instruction sets against the portable dot product, bit
    /// for bit, on random weights and activations.
    fn check_tile<const M: usize, const N: usize>(rng: &mut Xorshift) {
        let cols = 32 * 11;
        for format in FORMATS {
            let data = sample::weights(OwnFormat::Blocks(format), M, cols, rng);
            let w: [&[u8]; M] = std::array::from_fn(|i| {
                &data[i * format.row_bytes(cols)..][..format.row_bytes(cols)]
            });
            let acts: Vec<Q8Row> = (0..N)
                .map(|_| quantize_row(&sample::activations(1, cols, 3.0, rng)))
                .collect();
            let a: [&Q8Row; N] = std::array::from_fn(|r| &acts[r]);
            let mut results = vec![unsafe { tile_avx2(format, w, a) }];
            if vnni_available() {
                results.push(unsafe { tile_vnni(format, w, a) });
            }
            for got in results {
                for i in 0..M {
                    for r in 0..N {
                        let want = format.dot_portable(w[i], a[r]);
                        assert_eq!(
                            want.to_bits(),
                            got[i][r].to_bits(),
                            "{format:?} {M}x{N} [{i}][{r}]: {want} vs {}",
                            got[i][r]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn simd_tiles_match_the_portable_kernels_bit_for_bit() {
        if !available() {
            return;
        }
        let mut rng = Xorshift::new(7);
        for _ in 0..20 {
            check_tile::<1, 1>(&mut rng);
            check_tile::<1, 4>(&mut rng);
            check_tile::<2, 3>(&mut rng);
            check_tile::<2, 4>(&mut rng);
            check_tile::<4, 1>(&mut rng);
            check_tile::<1, 8>(&mut rng);
            check_tile::<2, 8>(&mut rng);
        }
    }
}

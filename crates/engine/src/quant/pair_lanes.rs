//! Q5_K and IQ4_XS weights laid out two rows to a 512-bit vector, for their AVX-512 VNNI
//! kernel. llama.cpp does not repack these formats: it multiplies them with its eight-lane
//! `vec_dot` (`ggml_vec_dot_q5_K_q8_K`, `ggml_vec_dot_iq4_xs_q8_K`), where lane `l` of a
//! sub-block of 32 takes values `4l..4l + 4` times the sub-block's scale, one fused
//! multiply-add per lane and super-block folds the lane into a float, and `hsum_float_8`
//! ends the row. Here a vector's sixteen 32-bit lanes are exactly those integer lanes for
//! two weight rows (lanes 0..8 the first row's, 8..16 the second's), so one `vpdpbusd`
//! takes 64 products and leaves every sum in its own lane; the floating-point steps are
//! those of the portable kernels lane for lane, so the results are bit-identical.
//!
//! Per pair of rows (an odd last row paired with a zero row) and super-block, a few
//! 64-byte lines:
//! - a header: the rows' `d` as `f32` at bytes 0 and 4, Q5_K's `dmin` at 8 and 12, the
//!   sub-blocks' scales as bytes at 16 (the first row's eight, then the second's; IQ4_XS's
//!   signed), and Q5_K's minimums as `i16` at 32 (likewise);
//! - four lines of 4-bit values: line `p` holds per row 32 bytes, byte `k` with value `k`
//!   of sub-block `2p` in its low nibble and of sub-block `2p + 1` in its high one (Q5_K's
//!   own `qs` layout; IQ4_XS's table indices are moved into it);
//! - for Q5_K, one line of fifth bits: per row its 32 `qh` bytes, bit `j` of byte `k`
//!   being the fifth bit of value `k` of sub-block `j`.
//!
//! Rows of micro-batches of 8 or more take the tiled kernel (`tiled`), whose arithmetic is
//! that of llama.cpp's tiled matmul, which it uses for them.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes. Q5_K's values are unsigned; IQ4_XS's
//! table values are signed, so the kernel looks them up 128 higher and starts each lane's
//! sum at −128 times the sum of its four activations ([`LaneSums`]).

use crate::quant::formats::iq4_xs::Iq4Xs;
use crate::quant::formats::kquant::{self, SuperBlock};
use crate::quant::formats::q5_k::Q5K;
use crate::quant::formats::view;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::OnceLock;

mod tiled;

use super::act_tile::Line;
use super::layout::Layout;
use super::output::Columns;
use super::{Activations, RowKernel, ACT_TILE};
use crate::quant::q8k::Q8KRow;
use crate::quant::q8k::QK_K;
use crate::simd::convert::f16_at;

/// A format this layout holds, as its kernels are written over it: the layout and the
/// kernels are generic over it, and each format's facts are its impl below.
pub(in crate::quant) trait PairLane: SuperBlock {
    /// Lines per pair of rows and super-block.
    const LINES: usize;
    /// Whether its values are Q5_K's five bits with minimums, not IQ4_XS's table indices.
    const FIVE_BITS: bool;
    /// Writes one super-block as row `half` (0 or 1) of its pair's lines.
    fn lay(block: &[u8], half: usize, out: &mut [Line]);
}

impl PairLane for Q5K {
    const LINES: usize = 6;
    const FIVE_BITS: bool = true;
    fn lay(block: &[u8], half: usize, out: &mut [Line]) {
        lay_q5k(block, half, out)
    }
}

impl PairLane for Iq4Xs {
    const LINES: usize = 5;
    const FIVE_BITS: bool = false;
    fn lay(block: &[u8], half: usize, out: &mut [Line]) {
        lay_iq4xs(block, half, out)
    }
}

/// A matrix of format `F` (Q5_K or IQ4_XS) in the two-row layout (see the module).
pub struct PairLanes<F> {
    rows: usize,
    blocks: usize,
    lines: Vec<Line>,
    format: PhantomData<F>,
}

impl<F: PairLane> PairLanes<F> {
    /// Lays out row-major super-blocks of `F` (`rows` rows of `blocks` each).
    pub fn new(raw: &[u8], rows: usize, blocks: usize) -> Self {
        let (block_bytes, per) = (size_of::<F>(), F::LINES);
        assert_eq!(raw.len(), rows * blocks * block_bytes, "{} rows", F::NAME);
        let mut lines = vec![Line([0; 64]); rows.div_ceil(2) * blocks * per];
        for r in 0..rows {
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * block_bytes..][..block_bytes];
                let out = &mut lines[((r / 2) * blocks + b) * per..][..per];
                F::lay(block, r % 2, out);
            }
        }
        Self {
            rows,
            blocks,
            lines,
            format: PhantomData,
        }
    }

    /// Rows of the matrix (without padding).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Pair `p`'s lines, super-block after super-block.
    fn pair(&self, p: usize) -> &[Line] {
        let len = self.blocks * F::LINES;
        &self.lines[p * len..(p + 1) * len]
    }
}

/// Writes one Q5_K super-block as row `half` (0 or 1) of its pair's lines.
fn lay_q5k(block: &[u8], half: usize, out: &mut [Line]) {
    let head = &mut out[0].0;
    head[4 * half..4 * half + 4].copy_from_slice(&f16_at(block, 0).to_le_bytes());
    head[8 + 4 * half..12 + 4 * half].copy_from_slice(&f16_at(block, 2).to_le_bytes());
    for j in 0..8 {
        let (scale, min) = kquant::scale_min_k4(j, &block[4..16]);
        head[16 + 8 * half + j] = scale as u8;
        let at = 32 + 16 * half + 2 * j;
        head[at..at + 2].copy_from_slice(&(min as i16).to_le_bytes());
    }
    for p in 0..4 {
        out[1 + p].0[32 * half..32 * half + 32].copy_from_slice(&block[48 + 32 * p..80 + 32 * p]);
    }
    out[5].0[32 * half..32 * half + 32].copy_from_slice(&block[16..48]);
}

/// Writes one IQ4_XS super-block as row `half` (0 or 1) of its pair's lines.
fn lay_iq4xs(block: &[u8], half: usize, out: &mut [Line]) {
    let head = &mut out[0].0;
    head[4 * half..4 * half + 4].copy_from_slice(&f16_at(block, 0).to_le_bytes());
    for j in 0..8 {
        head[16 + 8 * half + j] = view::<Iq4Xs>(block).scale(j) as i8 as u8;
    }
    // The index of value `k` of sub-block `ib`: sub-block `ib`'s sixteen bytes hold values
    // 0..16 in their low nibbles and 16..32 in their high ones.
    let index = |ib: usize, k: usize| {
        let qs = &block[8 + 16 * ib..8 + 16 * ib + 16];
        match k < 16 {
            true => qs[k] & 0x0F,
            false => qs[k - 16] >> 4,
        }
    };
    for p in 0..4 {
        for k in 0..32 {
            out[1 + p].0[32 * half + k] = index(2 * p, k) | (index(2 * p + 1, k) << 4);
        }
    }
}

/// Sums of one activation row's values that the kernels add besides the products: the sum
/// of each sub-block of 32 (for Q5_K's minimum terms, and for the tiled kernel's IQ4_XS
/// table offset), and for IQ4_XS −128 times the sum of each lane's four values (which
/// undoes the table's offset in the one-row kernel).
pub struct LaneSums {
    /// Per super-block, the eight sub-blocks' sums.
    pairs: Vec<i16>,
    /// IQ4_XS: per super-block and sub-block, the eight lanes' offsets.
    offsets: Vec<i32>,
}

impl LaneSums {
    /// The sums `F`'s kernels take for activation row `a`.
    pub fn new<F: PairLane>(a: &Q8KRow) -> Self {
        // A sub-block of 32 sums to at most 32 · 128 in magnitude: an i16.
        let pairs = a
            .bsums
            .chunks_exact(2)
            .map(|two| (two[0] + two[1]) as i16)
            .collect();
        let offsets = match F::FIVE_BITS {
            true => Vec::new(),
            false => {
                a.qs.chunks_exact(4)
                    .map(|four| -128 * four.iter().map(|&q| q as i32).sum::<i32>())
                    .collect()
            }
        };
        Self { pairs, offsets }
    }

    /// Whether the sums cover `blocks` super-blocks for `F`.
    fn covers<F: PairLane>(&self, blocks: usize) -> bool {
        match F::FIVE_BITS {
            true => self.pairs.len() >= blocks * 8,
            false => self.pairs.len() >= blocks * 8 && self.offsets.len() >= blocks * QK_K / 4,
        }
    }
}

/// The sums of a matmul's activation rows that kernels add besides the products: each
/// format's [`LaneSums`], and Q6_K's tiled offsets (`q6k_lanes::tiled`), each computed
/// once (by the first chunk that needs them) for all its chunks.
#[derive(Default)]
pub struct SumsOnce {
    q5k: OnceLock<Vec<LaneSums>>,
    iq4xs: OnceLock<Vec<LaneSums>>,
    q6k: OnceLock<Vec<Vec<i32>>>,
}

impl SumsOnce {
    /// `F`'s sums of the rows `a` (which must be the rows they were first asked for).
    pub fn get<F: PairLane>(&self, a: &[Q8KRow]) -> &[LaneSums] {
        let once = match F::FIVE_BITS {
            true => &self.q5k,
            false => &self.iq4xs,
        };
        let sums = once.get_or_init(|| a.iter().map(LaneSums::new::<F>).collect());
        assert_eq!(sums.len(), a.len());
        sums
    }

    /// Per row of `a` (which must be the rows they were first asked for) and sub-block of
    /// 16, −32 times its activations' sum: Q6_K's values are stored 32 higher.
    pub fn q6k_offsets(&self, a: &[Q8KRow]) -> &[Vec<i32>] {
        let offsets = self.q6k.get_or_init(|| {
            a.iter()
                .map(|a| a.bsums.iter().map(|&s| -32 * s).collect())
                .collect()
        });
        assert_eq!(offsets.len(), a.len());
        offsets
    }
}

/// The sum of a row's eight float lanes, in `hsum_float_8`'s order.
fn hsum8(lanes: &[f32]) -> f32 {
    crate::simd::reduce::hsum8(lanes.try_into().expect("eight lanes"))
}

#[cfg(target_arch = "x86_64")]
pub use simd::dot_pair;

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{hsum8, LaneSums, Line, PairLane, PairLanes};
    use crate::quant::q8k::Q8KRow;
    use crate::quant::q8k::QK_K;
    use crate::simd::prefetch::prefetch_span;

    /// Pair `p`'s two rows against `T` activation rows (with their [`LaneSums`] for the
    /// matrix's format): `out[t][h]` is row `2p + h` · `a[t]` (zero past the matrix).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI) must be available
    /// ([`crate::simd::vnni`]).
    pub unsafe fn dot_pair<const T: usize, F: PairLane>(
        m: &PairLanes<F>,
        p: usize,
        a: [&Q8KRow; T],
        sums: [&LaneSums; T],
    ) -> [[f32; 2]; T] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
            assert!(sums.iter().all(|s| s.covers::<F>(m.blocks)));
            let lines = m.pair(p);
            match F::FIVE_BITS {
                true => pair_q5k(lines, m.blocks, a, sums),
                false => pair_iq4xs(lines, m.blocks, a, sums),
            }
        }
    }

    /// Lane `i` takes lane `first` of its source for `i < 8`, lane `second` past it.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn halves(first: i32, second: i32) -> __m512i {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let idx: [i32; 16] = std::array::from_fn(|i| if i < 8 { first } else { second });
            _mm512_loadu_si512(idx.as_ptr() as *const __m512i)
        }
    }

    /// Activations `32j..32j + 32` of super-block `b`, in both halves of a vector.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and AVX-512 F; super-block `b` is one of `a`'s and `j < 8`.
    #[inline(always)]
    unsafe fn activations(a: &Q8KRow, b: usize, j: usize) -> __m512i {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let y = a.qs.as_ptr().add(b * QK_K + 32 * j) as *const __m256i;
            _mm512_broadcast_i64x4(_mm256_loadu_si256(y))
        }
    }

    /// The rows' eight float lanes each, summed as `hsum_float_8`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn row_sums(acc: __m512) -> [f32; 2] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
            [hsum8(&lanes[..8]), hsum8(&lanes[8..])]
        }
    }

    /// [`dot_pair`] for Q5_K: per super-block and sub-block `j`, the 5-bit values of both
    /// rows decoded once, then per activation row one `vpdpbusd` (64 products) and one
    /// `vpdpwssd` by the sub-block's scales into the lanes; per super-block one fused
    /// multiply-add per lane by `d`, and one per row by `dmin` for the minimum terms.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI); the arguments are [`dot_pair`]'s, as its caller guarantees them.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
    unsafe fn pair_q5k<const T: usize>(
        lines: &[Line],
        blocks: usize,
        a: [&Q8KRow; T],
        sums: [&LaneSums; T],
    ) -> [[f32; 2]; T] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let ahead = crate::simd::cpu::prefetch_ahead();
            const LINES: usize = 6;
            assert!(lines.len() >= blocks * LINES);
            let low = _mm512_set1_epi8(0x0F);
            let bit4 = _mm512_set1_epi8(0x10);
            let zero = _mm512_setzero_si512();
            let by_row = halves(0, 1);
            let dmin_by_row = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
            let mut acc = [_mm512_setzero_ps(); T];
            let mut acc_min = [_mm256_setzero_ps(); T];
            for b in 0..blocks {
                let base = lines.as_ptr().add(b * LINES);
                prefetch_span(base, LINES * 64, ahead);
                let line = |k: usize| _mm512_load_si512(base.add(k) as *const __m512i);
                let head = base as *const u8;
                let qh = line(5);
                // The sixteen scales as 32-bit lanes: the first row's, then the second's.
                let scales = _mm512_cvtepu8_epi32(_mm_loadu_si128(head.add(16) as *const __m128i));
                let mut lanes = [zero; T];
                for j in 0..8 {
                    let v = line(1 + j / 2);
                    let nibbles = match j % 2 {
                        0 => _mm512_and_si512(v, low),
                        _ => _mm512_and_si512(_mm512_srli_epi16::<4>(v), low),
                    };
                    // Bit j of each qh byte moved to bit 4 (16-bit shifts: bit 4 of a byte
                    // comes from the same byte for shifts of at most four either way).
                    let high = match j <= 4 {
                        true => _mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - j as i32)),
                        false => _mm512_srl_epi16(qh, _mm_cvtsi32_si128(j as i32 - 4)),
                    };
                    // nibbles | (high & 0x10)
                    let x = _mm512_ternarylogic_epi32::<0xF8>(nibbles, high, bit4);
                    let scale = _mm512_permutexvar_epi32(halves(j as i32, 8 + j as i32), scales);
                    for t in 0..T {
                        let dot = _mm512_dpbusd_epi32(zero, x, activations(a[t], b, j));
                        // A lane's four products fit in 16 bits (4 · 31 · 128), the scale's
                        // high half is zero: one 16-bit multiply-add is the product.
                        lanes[t] = _mm512_dpwssd_epi32(lanes[t], dot, scale);
                    }
                }
                let head4 = _mm_loadu_ps(head as *const f32);
                let d = _mm512_permutexvar_ps(by_row, _mm512_castps128_ps512(head4));
                let dmin = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(head4), dmin_by_row);
                let mins = _mm256_loadu_si256(head.add(32) as *const __m256i);
                for t in 0..T {
                    let da = *a[t].d.get_unchecked(b);
                    let dd = _mm512_mul_ps(_mm512_set1_ps(da), d);
                    acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lanes[t]), acc[t]);
                    // Each row's minimum term: eight products summed within its half.
                    let pairs = sums[t].pairs.as_ptr().add(8 * b) as *const __m128i;
                    let pairs = _mm256_broadcastsi128_si256(_mm_loadu_si128(pairs));
                    let mut imin = _mm256_madd_epi16(mins, pairs);
                    imin = _mm256_add_epi32(imin, _mm256_shuffle_epi32::<0x4E>(imin));
                    imin = _mm256_add_epi32(imin, _mm256_shuffle_epi32::<0xB1>(imin));
                    let dm = _mm256_mul_ps(_mm256_set1_ps(-da), dmin);
                    acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), dm, acc_min[t]);
                }
            }
            let mut out = [[0f32; 2]; T];
            for t in 0..T {
                let mut mins = [0f32; 8];
                _mm256_storeu_ps(mins.as_mut_ptr(), acc_min[t]);
                let rows = row_sums(acc[t]);
                out[t] = [rows[0] + mins[0], rows[1] + mins[4]];
            }
            out
        }
    }

    /// [`dot_pair`] for IQ4_XS: per super-block and sub-block `j`, both rows' table
    /// values looked up once (128 higher, unsigned), then per activation row one
    /// `vpdpbusd` from the lanes' offsets and one multiplication by the sub-block's signed
    /// scales into the lanes; per super-block one fused multiply-add per lane by `d`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI); the arguments are [`dot_pair`]'s, as its caller guarantees them.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
    unsafe fn pair_iq4xs<const T: usize>(
        lines: &[Line],
        blocks: usize,
        a: [&Q8KRow; T],
        sums: [&LaneSums; T],
    ) -> [[f32; 2]; T] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let ahead = crate::simd::cpu::prefetch_ahead();
            const LINES: usize = 5;
            assert!(lines.len() >= blocks * LINES);
            let low = _mm512_set1_epi8(0x0F);
            let table: [u8; 16] = crate::quant::iq4::VALUES.map(|v| (v as i32 + 128) as u8);
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr() as *const __m128i));
            let zero = _mm512_setzero_si512();
            let by_row = halves(0, 1);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..blocks {
                let base = lines.as_ptr().add(b * LINES);
                prefetch_span(base, LINES * 64, ahead);
                let line = |k: usize| _mm512_load_si512(base.add(k) as *const __m512i);
                let head = base as *const u8;
                let scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(head.add(16) as *const __m128i));
                let mut lanes = [zero; T];
                for j in 0..8 {
                    let v = line(1 + j / 2);
                    let index = match j % 2 {
                        0 => _mm512_and_si512(v, low),
                        _ => _mm512_and_si512(_mm512_srli_epi16::<4>(v), low),
                    };
                    let x = _mm512_shuffle_epi8(table, index);
                    let scale = _mm512_permutexvar_epi32(halves(j as i32, 8 + j as i32), scales);
                    for t in 0..T {
                        let offsets =
                            sums[t].offsets.as_ptr().add((8 * b + j) * 8) as *const __m256i;
                        let start = _mm512_broadcast_i64x4(_mm256_loadu_si256(offsets));
                        let dot = _mm512_dpbusd_epi32(start, x, activations(a[t], b, j));
                        lanes[t] = _mm512_add_epi32(lanes[t], _mm512_mullo_epi32(dot, scale));
                    }
                }
                let d =
                    _mm512_permutexvar_ps(by_row, _mm512_castps128_ps512(_mm_loadu_ps(head as _)));
                for t in 0..T {
                    let dd = _mm512_mul_ps(d, _mm512_set1_ps(*a[t].d.get_unchecked(b)));
                    acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lanes[t]), acc[t]);
                }
            }
            acc.map(|acc| row_sums(acc))
        }
    }
}

impl<F: PairLane> Layout for PairLanes<F> {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.lines);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8K(a, once) = acts else {
            unreachable!("this layout takes Q8_K activations");
        };
        #[cfg(target_arch = "x86_64")]
        {
            let (m, start, end) = (self, range.start, range.end);
            let sums = once.get::<F>(a);
            // Rows of wide micro-batches take the tiled kernel, as in llama.cpp; the rest
            // the one-row arithmetic.
            let (wide, alone): (Vec<usize>, Vec<usize>) =
                (0..kernels.len()).partition(|&t| kernels[t].in_wide_batch());
            if !wide.is_empty() {
                // SAFETY: the layout is only built where the CPU has AVX-512 VNNI.
                unsafe { tiled::chunk(m, a, sums, &wide, range.clone(), out) };
            }
            // Two weight rows by up to four activation rows, over activation tiles that
            // stay in the first-level cache.
            for tile in alone.chunks(ACT_TILE) {
                for p in start / 2..end.div_ceil(2) {
                    for rows in tile.chunks(4) {
                        let mut got = [[0f32; 2]; 4];
                        // SAFETY: the layout is only built where the CPU has AVX-512 VNNI.
                        with_row_count!(rows.len(), got, T => unsafe {
                            dot_pair::<T, F>(
                                m,
                                p,
                                std::array::from_fn(|k| &a[rows[k]]),
                                std::array::from_fn(|k| &sums[rows[k]]),
                            )
                        });
                        for (&t, got) in rows.iter().zip(&got) {
                            for (h, &v) in got.iter().enumerate() {
                                let r = 2 * p + h;
                                if r < end.min(m.rows()) {
                                    out.set(t, r, v);
                                }
                            }
                        }
                    }
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (a, once, kernels, range, out);
            unreachable!("the layout is only built where the CPU has AVX-512 VNNI");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::formats::{iq4_xs, q5_k};
    use crate::quant::q8k::quantize_row_q8k;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::{OwnFormat, RowKernel};

    /// Every row of both formats (an odd number of them), against one to four activation
    /// rows, equals the portable dot product bit for bit.
    #[test]
    fn pair_kernel_is_bit_identical_to_the_portable_one() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run.
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        let mut rng = Xorshift::new(17);
        check::<Q5K>(OwnFormat::Q5_K, q5_k::dot, &mut rng);
        check::<Iq4Xs>(OwnFormat::IQ4_XS, iq4_xs::dot, &mut rng);
    }

    /// [`pair_kernel_is_bit_identical_to_the_portable_one`] for `F` (random blocks of
    /// `own`), whose portable product is `dot`.
    fn check<F: PairLane>(own: &OwnFormat, dot: fn(&[u8], &Q8KRow) -> f32, rng: &mut Xorshift) {
        let (rows, cols) = (7, 3 * QK_K);
        let raw = sample::weights(own, rows, cols, rng);
        let m = PairLanes::<F>::new(&raw, rows, cols / QK_K);
        // Large activations too, so that every lane's sums reach their extremes.
        let acts: Vec<Q8KRow> = [4.0, 0.01, 300.0, 1.0]
            .iter()
            .map(|&s| quantize_row_q8k(&sample::activations(1, cols, s, rng), RowKernel::Gemv))
            .collect();
        let sums: Vec<LaneSums> = acts.iter().map(LaneSums::new::<F>).collect();
        let row_bytes = own.row_bytes(cols);
        let want = |r: usize, a: &Q8KRow| dot(&raw[r * row_bytes..][..row_bytes], a);
        for p in 0..rows.div_ceil(2) {
            // SAFETY: VNNI was checked.
            let four = unsafe {
                dot_pair::<4, F>(
                    &m,
                    p,
                    std::array::from_fn(|t| &acts[t]),
                    std::array::from_fn(|t| &sums[t]),
                )
            };
            // SAFETY: as above: VNNI was checked.
            let one = unsafe { dot_pair::<1, F>(&m, p, [&acts[2]], [&sums[2]]) };
            for h in 0..2 {
                let r = 2 * p + h;
                for t in 0..4 {
                    let want = if r < rows { want(r, &acts[t]) } else { 0.0 };
                    let name = F::NAME;
                    assert_eq!(
                        want.to_bits(),
                        four[t][h].to_bits(),
                        "{name} row {r} act {t}"
                    );
                    if t == 2 {
                        assert_eq!(want.to_bits(), one[0][h].to_bits(), "{name} row {r} alone");
                    }
                }
            }
        }
    }
}
